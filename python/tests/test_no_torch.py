"""`import kvvm` works without torch: numpy views only, and a clear error for tensors."""
import os
import subprocess
import sys
import textwrap

import kvvm

PKG_PARENT = os.path.dirname(os.path.dirname(kvvm.__file__))

CODE = """
import sys
class NoTorch:                                  # as if torch were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, NoTorch())
import numpy as np
import kvvm
assert "torch" not in sys.modules
c = kvvm.Context(backend="emulated", n_regions=2, bytes_per_token=64, max_seqs=4,
                 max_tokens=256, emu_granule=4096, device_budget="256K", emu_opaque=0)
s = c.create(); s.grow(5)
a = s.array(0, np.float32, (2, 8)); a[:] = 3
assert s.read(0, 0, 64) == np.full(16, 3, np.float32).tobytes()
cache = kvvm.KVCache(c, 1, 2, 8, np.float32)
K, V = cache.update(0, s, np.ones((5, 2, 8), np.float32), np.zeros((5, 2, 8), np.float32))
assert K.shape == (5, 2, 8) and (K == 1).all()
try:
    s.tensor(0, np.float32, (16,))
except ImportError as e:
    print("tensor refused:", e)
assert "torch" not in sys.modules
c.close()
print("ok without torch")
"""


def test_import_without_torch():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok without torch" in r.stdout
    assert "tensor refused: kvvm: tensor views need PyTorch" in r.stdout
