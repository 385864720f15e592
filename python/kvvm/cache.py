"""kvvm.KVCache: the cache object a model's attention code calls, like Hugging Face's
Cache.update.

Layout: n_regions = 2 * n_layers, region 2l = layer l's K, 2l + 1 its V, one token =
(n_kv_heads, head_dim) elements of dtype. The engine grows each sequence once per step
(seq.grow(seq.length + n_new), or ctx.grow_batch); then every layer calls
    K, V = cache.update(layer, seq, k, v)
with k, v of shape (n_new, n_kv_heads, head_dim): they are written at tokens
[length - n_new, length) through the zero-copy views, and the (length, n_kv_heads,
head_dim) views of the whole K and V are returned. On a GPU the write is a device copy on
torch's current stream: make it the engine stream (ctx.set_stream). The views returned are
the package's own tensors: a swap_out, free or truncate of the sequence (or a step under
auto_swap) empties them in place (docs/python.md, stale views).

After seq.discard(first_kept) (sliding-window attention) the tokens before first_kept are
gone and their pages unmapped: the views then cover tokens [first_kept, length) only, of
shape (length - first_kept, n_kv_heads, head_dim) (row i is token first_kept + i). KVCache
reads first_kept from seq.info (the smallest over the regions): discard every region alike,
seq.discard(first_kept), for a sequence that KVCache serves.
"""
from weakref import ref as _ref

from . import _views
from ._errors import InvalidArgument


class KVCache:
    def __init__(self, ctx, n_layers, n_kv_heads, head_dim, dtype):
        self.ctx = ctx
        self.n_layers = int(n_layers)
        self.n_kv_heads = int(n_kv_heads)
        self.head_dim = int(head_dim)
        self.dtype = dtype
        self.torch = _views.is_torch_dtype(dtype)
        itemsize = _views.element_info(dtype)[0]
        bpt = self.n_kv_heads * self.head_dim * itemsize
        if ctx.n_regions != 2 * self.n_layers:
            raise InvalidArgument(22, "KVCache: the context has n_regions %d; %d layers need "
                                  "n_regions = 2 * n_layers = %d (region 2l = layer l's K, "
                                  "2l + 1 its V)" % (ctx.n_regions, self.n_layers,
                                                     2 * self.n_layers))
        if ctx.bytes_per_token != bpt:
            raise InvalidArgument(22, "KVCache: the context has bytes_per_token %d; "
                                  "n_kv_heads %d * head_dim %d * itemsize %d = %d"
                                  % (ctx.bytes_per_token, self.n_kv_heads, self.head_dim,
                                     itemsize, bpt))
        self.shape = (self.n_kv_heads, self.head_dim)
        self._kind = "torch" if self.torch else "numpy"
        self._np_cuda_check = not self.torch     # numpy views: checked per call (slower)
        # the key of this cache's per-layer (K row, V row) pairs in Sequence._views (rows
        # over tokens [0, max_tokens) at the sequence's own address, made on first use):
        # the object itself, hashed by identity (a tuple key is hashed anew at every call)
        self._key = self

    def _views(self, layer, seq):
        """(K view, V view, first_kept) of `seq` at `layer` over tokens [first_kept,
        length), registered for stale-view invalidation (torch). Per call: one
        kvvm_seq_view_state for both views (Sequence._view_state), two slices of the rows
        cached per sequence (dropped whenever the sequence moves: Sequence._stale), two
        registrations. update() inlines this for torch views."""
        if not 0 <= layer < self.n_layers:
            raise InvalidArgument(22, "layer %d is outside [0, %d)" % (layer, self.n_layers))
        if self._np_cuda_check and seq.ctx.backend == "cuda":
            seq.array(2 * layer, self.dtype, self.shape)    # raises NotSupported
        # tokens [0, first_kept) are discarded, never in a view
        length, first = seq._view_state()
        rows = seq._views.get(self._key)
        if rows is None:
            rows = seq._views[self._key] = [None] * self.n_layers
        pair = rows[layer]
        if pair is None:
            pair = rows[layer] = (seq._row(2 * layer, self.dtype, self.shape, self._kind),
                                  seq._row(2 * layer + 1, self.dtype, self.shape, self._kind))
        K = pair[0][first:length]
        V = pair[1][first:length]
        if self.torch:
            handed = seq._handed
            handed.add(K)
            handed.add(V)
        return K, V, first

    def keys_values(self, layer, seq):
        """The (length - first_kept, n_kv_heads, head_dim) K and V views of `seq` at `layer`
        (first_kept = 0 unless tokens were discarded)."""
        K, V, _ = self._views(layer, seq)
        return K, V

    def update(self, layer, seq, k, v):
        """Writes k, v (n_new, n_kv_heads, head_dim) at tokens [length - n_new, length) and
        returns the K, V views over [first_kept, length)."""
        # _views inlined, and as few distinct operations as the checks allow: inside a
        # decode step the attention between two calls evicts the CPU caches, and each
        # distinct Python, torch or C path the call takes costs microseconds there.
        if not 0 <= layer < self.n_layers or self._np_cuda_check:
            return self._update_checked(layer, seq, k, v)
        length, first = seq._view_state()
        rows = seq._views.get(self._key)
        pair = rows[layer] if rows is not None else None
        if pair is None:
            return self._update_checked(layer, seq, k, v)
        K = pair[0][first:length]
        V = pair[1][first:length]
        handed = seq._handed
        refs = handed.refs
        refs.append(_ref(K))
        refs.append(_ref(V))
        if len(refs) >= handed.limit:
            handed.prune()
        ks = k.shape
        if ks != v.shape or ks[1:] != self.shape or ks[0] > length - first:
            return self._write_checked(K, V, first, k, v)
        held = length - first
        K[held - ks[0]:held] = k
        V[held - ks[0]:held] = v
        return K, V

    def _update_checked(self, layer, seq, k, v):
        K, V, first_kept = self._views(layer, seq)
        return self._write_checked(K, V, first_kept, k, v)

    @staticmethod
    def _write_checked(K, V, first_kept, k, v):
        n = k.shape[0]
        held = K.shape[0]
        want = (n,) + tuple(K.shape[1:])
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise InvalidArgument(22, "KVCache.update: k %s and v %s must both be %s"
                                  % (tuple(k.shape), tuple(v.shape), want))
        if n > held:
            if first_kept:
                raise InvalidArgument(22, "KVCache.update: %d new tokens but the sequence "
                                      "holds %d after first_kept %d (tokens [0, %d) were "
                                      "discarded): grow it first (seq.grow(seq.length + "
                                      "n_new))" % (n, held, first_kept, first_kept))
            raise InvalidArgument(22, "KVCache.update: %d new tokens but the sequence holds "
                                  "%d: grow it first (seq.grow(seq.length + n_new))"
                                  % (n, held))
        K[held - n:held] = k
        V[held - n:held] = v
        return K, V

    def get_seq_length(self, seq):
        return seq.length
