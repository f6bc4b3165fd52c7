/*
 * cudalloc: allocate and free GPU memory through the CUDA driver API, with
 * no CUDA toolkit, headers or PyTorch: libcuda.so.1 (installed with the
 * NVIDIA driver) is loaded with dlopen() and the few functions it needs are
 * declared here. Used by scripts/gpu-check.sh.
 *
 *   cudalloc DEVICE MIB HOLD_SECONDS
 *
 * Creates a context on DEVICE, allocates MIB MiB, touches nothing else,
 * prints "allocated <bytes> pid <pid>" and flushes, holds for HOLD_SECONDS
 * (0: until killed), frees, destroys the context and prints "freed".
 * Exit 0 on success, 1 with a message naming the failed call otherwise.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult; /* CUDA_SUCCESS is 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr; /* 64-bit on every supported platform */

typedef CUresult (*cuInit_t)(unsigned int);
typedef CUresult (*cuDeviceGet_t)(CUdevice *, int);
typedef CUresult (*cuCtxCreate_t)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*cuCtxDestroy_t)(CUcontext);
typedef CUresult (*cuMemAlloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemFree_t)(CUdeviceptr);
typedef CUresult (*cuGetErrorString_t)(CUresult, const char **);

static void *lib;

/* sym finds a symbol, preferring the _v2 entry points the headers map to. */
static void *sym(const char *v2, const char *v1) {
	void *p = v2 ? dlsym(lib, v2) : NULL;
	if (!p) p = dlsym(lib, v1);
	if (!p) {
		fprintf(stderr, "cudalloc: libcuda.so.1 has no %s\n", v1);
		exit(1);
	}
	return p;
}

static void check(CUresult r, const char *call) {
	if (r == 0) return;
	const char *msg = "unknown error";
	cuGetErrorString_t es = (cuGetErrorString_t)dlsym(lib, "cuGetErrorString");
	if (es) es(r, &msg);
	fprintf(stderr, "cudalloc: %s failed: %d (%s)\n", call, r, msg);
	exit(1);
}

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: cudalloc DEVICE MIB HOLD_SECONDS\n");
		return 2;
	}
	int dev = atoi(argv[1]);
	size_t mib = (size_t)strtoull(argv[2], NULL, 10);
	int hold = atoi(argv[3]);
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "cudalloc: cannot load libcuda.so.1 (%s): is the NVIDIA driver installed?\n", dlerror());
		return 1;
	}
	cuInit_t cuInit = (cuInit_t)sym(NULL, "cuInit");
	cuDeviceGet_t cuDeviceGet = (cuDeviceGet_t)sym(NULL, "cuDeviceGet");
	cuCtxCreate_t cuCtxCreate = (cuCtxCreate_t)sym("cuCtxCreate_v2", "cuCtxCreate");
	cuCtxDestroy_t cuCtxDestroy = (cuCtxDestroy_t)sym("cuCtxDestroy_v2", "cuCtxDestroy");
	cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)sym("cuMemAlloc_v2", "cuMemAlloc");
	cuMemFree_t cuMemFree = (cuMemFree_t)sym("cuMemFree_v2", "cuMemFree");

	CUdevice d;
	CUcontext ctx;
	CUdeviceptr p;
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&d, dev), "cuDeviceGet");
	check(cuCtxCreate(&ctx, 0, d), "cuCtxCreate");
	check(cuMemAlloc(&p, mib << 20), "cuMemAlloc");
	printf("allocated %zu pid %d\n", mib << 20, (int)getpid());
	fflush(stdout);
	if (hold > 0) {
		sleep((unsigned)hold);
	} else {
		for (;;) pause();
	}
	check(cuMemFree(p), "cuMemFree");
	check(cuCtxDestroy(ctx), "cuCtxDestroy");
	printf("freed\n");
	return 0;
}
