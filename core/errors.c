/*
 * core/errors.c: what an errno means, kvvm_strerror and the names used in messages.
 */
#include "core.h"

#include <errno.h>
#include <string.h>

/* The errno's name, for messages ("-ENOENT"). */
const char *core_err_name(int err)
{
    switch (err < 0 ? -err : err) {
#define N(e) case e: return "-" #e;
    N(EINVAL) N(ENOENT) N(E2BIG) N(ENOSPC) N(ENOMEM) N(EBADMSG) N(EIO) N(ENODEV) N(EBUSY)
    N(EOPNOTSUPP) N(EUCLEAN) N(ENOTDIR) N(EACCES) N(EPERM) N(EROFS) N(ENAMETOOLONG)
    N(ELOOP) N(EDQUOT) N(EFBIG) N(EMFILE) N(ENFILE) N(EAGAIN) N(ENOSYS) N(ESTALE)
#undef N
    }
    return "error";
}

/* Describes the errno itself, for every call that can return it (docs/api.md lists which
   call returns which); kvvm_last_error() has the reason of the last failure. */
const char *kvvm_strerror(int err)
{
    switch (err < 0 ? -err : err) {
    case 0: return "success";
    case EINVAL: return "invalid argument: a NULL pointer, a region, length or byte range "
                        "outside the sequence, a share target that is not empty, a sequence "
                        "named twice, a stream not of this context, or a bad config field "
                        "(kvvm_last_error() says which)";
    case ENOENT: return "not found: an unknown or freed sequence handle, or a missing file "
                        "or directory (spill_dir)";
    case E2BIG: return "too long: a length past max_tokens";
    case ENOSPC: return "no space: no free sequence slot (max_seqs live sequences), a full "
                        "spill device (spill_budget cannot be reserved), or a JSON buffer "
                        "too small (kvvm_stats_json)";
    case ENOMEM: return "out of memory: no device page can be had (nothing reclaimable), no "
                        "room in the host or disk tier, or host memory or the address "
                        "reservation could not be had";
    case EBADMSG: return "data lost: this sequence's disk copy failed its checksum or could "
                         "not be read";
    case EIO: return "I/O error: the context is dead (a sticky driver error or an "
                     "unrecoverable fault; every later call fails, close it), or a disk "
                     "write or read of the spill file failed";
    case ENODEV: return "no usable CUDA device (no driver, no GPU, or a device ordinal out "
                        "of range)";
    case EBUSY: return "busy: the engine stream is capturing a CUDA graph (calls that "
                       "would enqueue on it are refused until the capture ends), or the "
                       "stream to destroy is the engine stream now";
    case EOPNOTSUPP: return "not supported: the I/O engine asked for (KVVM_IO_ENGINE) or a "
                            "file system feature the spill file needs is unavailable";
    case EUCLEAN: return "an internal invariant does not hold (a libkvvm bug: please report "
                         "it)";
    case ENOTDIR: return "not a directory: spill_dir, or a component of its path, is not a "
                         "directory";
    case EACCES: return "permission denied: this process may not create the spill file in "
                        "spill_dir";
    case EPERM: return "operation not permitted: this process may not create or reserve "
                       "the spill file in spill_dir";
    case EROFS: return "read-only file system: spill_dir is on a read-only mount";
    case ENAMETOOLONG: return "file name too long: spill_dir's path";
    case EDQUOT: return "disk quota exceeded: spill_budget cannot be reserved in spill_dir";
    case EFBIG: return "file too large: spill_budget exceeds what spill_dir's file system "
                       "allows in one file";
    case ESTALE: return "stale: the sequence is a dropped CACHED sequence (reclaim released "
                        "its pages); free it, or kvvm_seq_set_class it to use it again as an "
                        "empty sequence";
    }
    return strerror(err < 0 ? -err : err);
}
