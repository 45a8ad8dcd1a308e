/*
 * vkfault: a Vulkan interposer that fails chosen calls on command, for fault
 * injection tests. Linked into a test executable (libvkfault_static), its
 * definitions of vkAllocateMemory, vkQueueSubmit and vkWaitForFences take the
 * place of the loader's for the engine code linked into the same program;
 * preloaded into vkscand (LD_PRELOAD=libvkfault.so) it does the same for the
 * daemon. Every other call, and every call while nothing is armed, goes to
 * the next definition (the Vulkan loader).
 *
 * Arming: vkfault_arm() from the test, or the environment variable
 * VKFAULT="alloc=N,submit=N,wait=N,lost=N,pipeline=N" read at the first
 * intercepted call: the Nth call of that kind from then on fails (once),
 * with VK_ERROR_OUT_OF_DEVICE_MEMORY (alloc, submit), VK_TIMEOUT (wait),
 * VK_ERROR_DEVICE_LOST (lost, on a fence wait) or VK_ERROR_UNKNOWN
 * (pipeline: what an H100's driver answers for a kernel it cannot build). A daemon already running
 * is armed through the file named by VKFAULT_CTL: write the same spec into
 * it (atomically: a temporary file renamed over); the next intercepted call
 * reads it, removes it and arms.
 *
 * Holding: with VKFAULT_HOLD naming a path, vkCreateInstance waits until
 * that path exists, so a daemon test can talk to vkscand while its GPU
 * engine is still starting (create the file to let it go on).
 */
#ifndef VKS_TESTS_VKFAULT_H
#define VKS_TESTS_VKFAULT_H

enum vkfault_op {
    VKFAULT_ALLOC = 0, /* vkAllocateMemory */
    VKFAULT_SUBMIT,    /* vkQueueSubmit */
    VKFAULT_WAIT,      /* vkWaitForFences: VK_TIMEOUT */
    VKFAULT_LOST,      /* vkWaitForFences: VK_ERROR_DEVICE_LOST */
    VKFAULT_PIPELINE,  /* vkCreateComputePipelines: VK_ERROR_UNKNOWN */
    VKFAULT_N_OPS
};

/* The `nth` call of `op` from now fails once; 0 disarms. */
void vkfault_arm(enum vkfault_op op, int nth);

/* The `nth` call of `op` from now and the `count` - 1 calls after it fail. */
void vkfault_arm_n(enum vkfault_op op, int nth, int count);

/* Calls of `op` failed so far. */
int vkfault_fired(enum vkfault_op op);

/* Calls of `op` seen so far (failed or passed on). */
int vkfault_calls(enum vkfault_op op);

#endif
