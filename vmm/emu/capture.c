/*
 * vmm/emu/capture.c: emulated graph capture: what a capture forbids and the capture-mode
 * rules.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

/* ---- stream capture ------------------------------------------------------------------ */
/* cuda.h, cuThreadExchangeStreamCaptureMode: while a capture begun in
   CU_STREAM_CAPTURE_MODE_GLOBAL is active, a thread whose mode is GLOBAL (the default), or
   THREAD_LOCAL in the capturing thread, "is prohibited from potentially unsafe API calls";
   a RELAXED thread is not. The emulated captures are GLOBAL ones. The unsafe calls emulated
   are the querying and synchronizing ones (cuEventQuery/Synchronize, cuStreamQuery/
   Synchronize, cuCtxSynchronize: what PyTorch's watchdog tripped over); a prohibited call
   fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, as the
   driver does. */
kcu_result emu_capture_unsafe_locked(void)
{
    if (emu_t.capmode == KCU_STREAM_CAPTURE_MODE_RELAXED)
        return KCU_SUCCESS;
    kcu_result r = KCU_SUCCESS;
    for (struct kcu_stream_st *s = emu.streams; s; s = s->next)
        if (s->capturing && !s->invalidated &&
            (emu_t.capmode == KCU_STREAM_CAPTURE_MODE_GLOBAL ||
             pthread_equal(s->cap_thread, pthread_self()))) {
            s->invalidated = true;
            r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    return r;
}

/* The CUDA programming guide (stream capture, "Prohibited and Unhandled Operations"): "it
   is also invalid to ... synchronize a broader handle which encompasses an active stream
   capture, such as a device or context handle when any associated stream is in capture
   mode", in every capture mode (a relaxed thread's cuCtxSynchronize too), and an invalid
   operation invalidates the captures it concerns: every capture of device d's streams. */
kcu_result emu_ctx_capture_locked(struct emu_dev *d)
{
    kcu_result r = KCU_SUCCESS;
    for (struct kcu_stream_st *s = emu.streams; s; s = s->next)
        if (s->dev == d && s->capturing) {
            s->invalidated = true;
            r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    return r;
}

/* cuda.h, cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is
   in an unusable state until the blocking stream capture is terminated": work on it is
   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (and the capture is invalidated: an illegal
   dependency was attempted). query_only: cuStreamIsCapturing, which invalidates nothing. */
kcu_result emu_legacy_capture_locked(struct emu_dev *d, bool query_only)
{
    kcu_result r = KCU_SUCCESS;
    for (struct kcu_stream_st *s = emu.streams; s; s = s->next)
        if (s->dev == d && s->capturing && !(s->flags & KCU_STREAM_NON_BLOCKING)) {
            if (!query_only)
                s->invalidated = true;
            r = KCU_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    return r;
}

/* The capture rules of a stream's query or synchronize: the capturing stream itself cannot
   be waited for (its work is not executed; "necessarily conflicts", in any mode), the legacy
   stream not while a blocking stream captures, and the call is an unsafe one. */
kcu_result emu_stream_capture_check_locked(struct kcu_stream_st *s, struct emu_dev *d)
{
    if (s && s->capturing) {
        s->invalidated = true;
        return KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    kcu_result r = s ? KCU_SUCCESS : emu_legacy_capture_locked(d, false);
    return r ? r : emu_capture_unsafe_locked();
}

/* Per-thread, no context needed (the capture mode belongs to the thread). */
kcu_result emu_cuThreadExchangeStreamCaptureMode(int *mode)
{
    BEGIN(cuThreadExchangeStreamCaptureMode, F_INIT);
    if (!mode || *mode < KCU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > KCU_STREAM_CAPTURE_MODE_RELAXED) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int old = emu_t.capmode;
    emu_t.capmode = *mode;
    *mode = old;
out:
    return emu_leave(r);
}

int emu_stream_set_capturing(kcu_stream stream, int on)
{
    pthread_mutex_lock(&emu.lock);
    struct kcu_stream_st *s = emu_stream_lookup_locked(stream);
    if (s) {
        s->capturing = on != 0;
        s->invalidated = false;
        s->cap_thread = pthread_self();
    }
    pthread_mutex_unlock(&emu.lock);
    return s ? 0 : -EINVAL;
}
