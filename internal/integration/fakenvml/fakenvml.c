/*
 * fakenvml.c: the stand-in libnvidia-ml.so.1 used by vllm-guard's tests and
 * by the vLLM simulator. It implements the part of NVML that vllm-guard
 * calls (and that go-nvml resolves at Init) on top of a state folder that
 * test code and the simulator write, so the real go-nvml code path runs
 * without a GPU.
 *
 * Built by internal/testbin.FakeNVML():
 *   gcc -shared -fPIC -O2 -Wall -Wno-deprecated-declarations \
 *       -I <go-nvml>/pkg/nvml -o DIR/libnvidia-ml.so.1 fakenvml.c
 *
 * State (FAKENVML_STATE=DIR, read at nvmlInit; every query re-reads files):
 *   DIR/devices           one device per line, line order = index
 *                         (blank and '#' lines ignored, malformed lines skipped):
 *                         <uuid> <total_bytes> <reserved_bytes> <name with spaces>
 *   DIR/procs/<pid>       lines "<device_index> <used_bytes>", written
 *                         atomically by the process holding the memory; it
 *                         counts only while <pid> is alive and not a zombie.
 *   DIR/release_delay_ms  optional: a dead pid's memory stays counted this
 *                         long after the library first saw it dead (the
 *                         time is kept in DIR/procs/<pid>.dead), like the
 *                         driver's teardown; then both files are removed
 *                         and "<pid> <ms since the epoch>" is appended to
 *                         DIR/released.
 *   DIR/fault             optional nvmlReturn_t returned by memory and
 *                         process queries while the file exists.
 *   DIR/init_fault        optional nvmlReturn_t returned by nvmlInit.
 *   DIR/driver_version    optional driver version string.
 *   DIR/health            optional, per-device hardware health: lines
 *                         "<device_index> <key> <value>", the last line of
 *                         a key wins (rewritten atomically by the tests):
 *                           lost 1                      every query on the
 *                               device returns NVML_ERROR_GPU_IS_LOST
 *                           ecc_volatile_uncorrected N  and
 *                           ecc_aggregate_uncorrected, ecc_volatile_corrected,
 *                           ecc_aggregate_corrected: nvmlDeviceGetTotalEccErrors
 *                           remap_corr N, remap_unc N, remap_pending 0|1,
 *                           remap_failure 0|1:         nvmlDeviceGetRemappedRows
 *                           retired_pending 0|1:       nvmlDeviceGetRetiredPagesPendingStatus
 *                           throttle MASK: clock event (throttle) reasons, as
 *                               nvmlDeviceGetCurrentClocksEventReasons answers
 *                           unsupported ecc|remap|retired|events|throttle (one line
 *                               each): that query answers NVML_ERROR_NOT_SUPPORTED
 *   DIR/events            optional, appended (O_APPEND) by the tests: lines
 *                         "<device_index> xid <n>", "<device_index> dbe" or
 *                         "<device_index> sbe". An event set delivers each
 *                         complete line appended after nvmlEventSetCreate,
 *                         once, when the device registered that event type
 *                         on the set (nvmlEventSetWait_v2 polls the file
 *                         every 5 ms until its timeout).
 *
 * Memory v1: used = reserved + sum(live procs), free = total - used
 * (clamped at 0; used is reported as is even above total). Memory v2:
 * used = sum(live procs), reserved as written, free = total - reserved - used
 * (clamped at 0).
 *
 * Symbols: nvmlInit/_v2, nvmlInitWithFlags, nvmlShutdown (reference counted),
 * nvmlErrorString, nvmlSystemGet{DriverVersion,NVMLVersion,CudaDriverVersion},
 * nvmlDeviceGetCount/_v2, nvmlDeviceGetHandleByIndex/_v2, ...ByUUID,
 * nvmlDeviceGet{UUID,Name,Index,MinorNumber}, nvmlDeviceGetMemoryInfo/_v2,
 * nvmlDeviceGetComputeRunningProcesses (v1, _v2, _v3; graphics and MPS _v3
 * list nothing), nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRemappedRows,
 * nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetSupportedEventTypes,
 * nvmlDeviceRegisterEvents, nvmlEventSetCreate, nvmlEventSetWait(_v2),
 * nvmlEventSetFree, nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons. Calls before nvmlInit return NVML_ERROR_UNINITIALIZED.
 * Thread-safe: the global state sits behind one mutex; scans use the stack
 * and the heap.
 */
#define _GNU_SOURCE
/* Declare the unversioned (v1) names too, so both v1 and the versioned
 * symbols that go-nvml looks up can be defined here under their real names. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include "nvml.h"

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_DEVICES 64
#define FAKE_MAX_PROCS 1024
#define FAKE_UUID_LEN 96
#define FAKE_NAME_LEN 96

struct nvmlDevice_st {
    char unused;
};

/* Handles are addresses in this array; the index is the offset. */
static struct nvmlDevice_st g_handles[FAKE_MAX_DEVICES];

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;             /* guarded by g_mu */
static char g_dir[PATH_MAX];       /* guarded by g_mu */

typedef struct {
    char uuid[FAKE_UUID_LEN];
    char name[FAKE_NAME_LEN];
    unsigned long long total;
    unsigned long long reserved;
} fake_device;

typedef struct {
    unsigned int pid;
    int device;
    unsigned long long used;
} fake_use;

/*
 * go-nvml binds NVML symbols lazily and process-wide (RTLD_GLOBAL): if this
 * library were unloaded by nvmlShutdown's dlclose, a later Init in the same
 * process could call through stale bindings. Pin it in memory instead.
 */
__attribute__((constructor)) static void fake_pin(void)
{
    Dl_info info;
    if (dladdr((void *)fake_pin, &info) && info.dli_fname != NULL) {
        (void)dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    }
}

/* state_dir copies the folder captured at init; NVML_ERROR_UNINITIALIZED
 * when the library is not initialised. */
static nvmlReturn_t state_dir(char *out, size_t n)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else {
        snprintf(out, n, "%s", g_dir);
    }
    pthread_mutex_unlock(&g_mu);
    return ret;
}

/* pathf formats a path; 0 when it does not fit (the caller treats the file
 * as absent rather than touching a truncated name). */
__attribute__((format(printf, 3, 4))) static int pathf(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return k >= 0 && (size_t)k < n;
}

/* read_small reads a whole small file into buf (NUL-terminated); -1 if absent. */
static ssize_t read_small(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    size_t off = 0;
    while (off + 1 < n) {
        ssize_t r = read(fd, buf + off, n - 1 - off);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            close(fd);
            return -1;
        }
        if (r == 0) {
            break;
        }
        off += (size_t)r;
    }
    close(fd);
    buf[off] = '\0';
    return (ssize_t)off;
}

/* read_int_file returns 1 and sets *v when path exists and holds an integer. */
static int read_int_file(const char *dir, const char *name, long long *v)
{
    char path[PATH_MAX], buf[64];
    if (!pathf(path, sizeof path, "%s/%s", dir, name) || read_small(path, buf, sizeof buf) < 0) {
        return 0;
    }
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (end == buf || errno != 0) {
        return 0;
    }
    *v = x;
    return 1;
}

/* fault_of returns DIR/fault's code while that file exists (an unreadable
 * or non-numeric fault file means NVML_ERROR_UNKNOWN). */
static nvmlReturn_t fault_of(const char *dir)
{
    char path[PATH_MAX];
    if (!pathf(path, sizeof path, "%s/fault", dir) || access(path, F_OK) != 0) {
        return NVML_SUCCESS;
    }
    long long v;
    if (!read_int_file(dir, "fault", &v) || v == 0) {
        return NVML_ERROR_UNKNOWN;
    }
    return (nvmlReturn_t)v;
}

/* parse_u64 parses an unsigned decimal token; returns the end or NULL. */
static char *parse_u64(char *s, unsigned long long *v)
{
    while (*s == ' ' || *s == '\t') {
        s++;
    }
    if (!isdigit((unsigned char)*s)) {
        return NULL;
    }
    char *end;
    errno = 0;
    *v = strtoull(s, &end, 10);
    if (errno != 0 || (*end != '\0' && *end != ' ' && *end != '\t')) {
        return NULL;
    }
    return end;
}

/* load_devices parses DIR/devices into devs; returns the count (0 when the
 * file is absent or empty). */
static int load_devices(const char *dir, fake_device *devs)
{
    char path[PATH_MAX];
    if (!pathf(path, sizeof path, "%s/devices", dir)) {
        return 0;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return 0;
    }
    char line[1024];
    int n = 0;
    while (n < FAKE_MAX_DEVICES && fgets(line, sizeof line, f) != NULL) {
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] != '\n' && !feof(f)) {
            /* Over-long line: skip the rest of it and the line itself. */
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n') {
            }
            continue;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' ||
                           line[len - 1] == ' ' || line[len - 1] == '\t')) {
            line[--len] = '\0';
        }
        char *s = line;
        while (*s == ' ' || *s == '\t') {
            s++;
        }
        if (*s == '\0' || *s == '#') {
            continue;
        }
        char *u = s;
        while (*s != '\0' && *s != ' ' && *s != '\t') {
            s++;
        }
        size_t ulen = (size_t)(s - u);
        if (ulen == 0 || ulen >= FAKE_UUID_LEN || *s == '\0') {
            continue;
        }
        *s++ = '\0';
        fake_device d;
        memset(&d, 0, sizeof d);
        memcpy(d.uuid, u, ulen);
        if ((s = parse_u64(s, &d.total)) == NULL) {
            continue;
        }
        if ((s = parse_u64(s, &d.reserved)) == NULL) {
            continue;
        }
        while (*s == ' ' || *s == '\t') {
            s++;
        }
        snprintf(d.name, sizeof d.name, "%s", *s ? s : "Fake GPU");
        devs[n++] = d;
    }
    fclose(f);
    return n;
}

/* proc_alive reads /proc/<pid>/stat: alive when it exists and the process
 * is neither a zombie nor dead. */
static int proc_alive(unsigned int pid)
{
    char path[64], buf[512];
    if (!pathf(path, sizeof path, "/proc/%u/stat", pid) || read_small(path, buf, sizeof buf) <= 0) {
        return 0;
    }
    /* The state follows the last ')' (the command may hold parentheses). */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ' || p[2] == '\0') {
        return 0;
    }
    char st = p[2];
    return st != 'Z' && st != 'X' && st != 'x';
}

/*
 * Reading /proc/<pid>/stat for every holder on every query is most of the
 * cost of a sample (8 devices x 16 processes, 3 queries per device), so a
 * process seen alive is remembered with a pidfd: it becomes readable when
 * the process exits (zombie included), which poll() tells in well under a
 * microsecond. A pid whose pidfd fired is re-checked through /proc, which
 * also covers pid reuse. Without pidfd_open (old kernels) /proc is read
 * every time.
 */
#define FAKE_MAX_PIDFDS 256

typedef struct {
    unsigned int pid;
    int fd;
} pidfd_entry;

static pidfd_entry g_pidfds[FAKE_MAX_PIDFDS]; /* guarded by g_mu */
static int g_npidfds;                         /* guarded by g_mu */

static int open_pidfd(unsigned int pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0); /* close-on-exec by default */
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* forget_pidfds closes every remembered pidfd (g_mu held). */
static void forget_pidfds(void)
{
    for (int i = 0; i < g_npidfds; i++) {
        close(g_pidfds[i].fd);
    }
    g_npidfds = 0;
}

static long long now_ms(void);

/*
 * sweep_pidfds closes the pidfds of processes that exited (g_mu held). A
 * pid whose state file went away with it is never asked about again, so
 * without this its pidfd would stay open in the host process for good.
 * At most once per 100 ms: one poll() over every remembered fd.
 */
static long long g_last_sweep; /* guarded by g_mu */

static void sweep_pidfds(void)
{
    long long now = now_ms();
    if (g_npidfds == 0 || now - g_last_sweep < 100) {
        return;
    }
    g_last_sweep = now;
    struct pollfd pfds[FAKE_MAX_PIDFDS];
    for (int i = 0; i < g_npidfds; i++) {
        pfds[i].fd = g_pidfds[i].fd;
        pfds[i].events = POLLIN;
        pfds[i].revents = 0;
    }
    if (poll(pfds, (nfds_t)g_npidfds, 0) <= 0) {
        return;
    }
    for (int i = g_npidfds - 1; i >= 0; i--) {
        if (pfds[i].revents != 0) {
            close(g_pidfds[i].fd);
            g_pidfds[i] = g_pidfds[--g_npidfds];
        }
    }
}

/* pid_alive reports whether pid is alive and not a zombie. */
static int pid_alive(unsigned int pid)
{
    pthread_mutex_lock(&g_mu);
    sweep_pidfds();
    for (int i = 0; i < g_npidfds; i++) {
        if (g_pidfds[i].pid != pid) {
            continue;
        }
        struct pollfd pfd = {.fd = g_pidfds[i].fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) == 0) {
            pthread_mutex_unlock(&g_mu);
            return 1;
        }
        close(g_pidfds[i].fd); /* exited: drop it and look again below */
        g_pidfds[i] = g_pidfds[--g_npidfds];
        break;
    }
    pthread_mutex_unlock(&g_mu);

    if (!proc_alive(pid)) {
        return 0;
    }
    int fd = open_pidfd(pid);
    if (fd >= 0) {
        pthread_mutex_lock(&g_mu);
        int known = 0;
        for (int i = 0; i < g_npidfds && !known; i++) {
            known = g_pidfds[i].pid == pid;
        }
        if (!known && g_npidfds < FAKE_MAX_PIDFDS && g_refcount > 0) {
            g_pidfds[g_npidfds].pid = pid;
            g_pidfds[g_npidfds].fd = fd;
            g_npidfds++;
            fd = -1;
        }
        pthread_mutex_unlock(&g_mu);
        if (fd >= 0) {
            close(fd);
        }
    }
    return 1;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* dead_still_held decides whether a dead pid's memory still counts under
 * DIR/release_delay_ms, remembering the first time its death was seen. */
static int dead_still_held(const char *procs, const char *pidname, long long delay)
{
    char path[PATH_MAX], buf[64];
    if (delay <= 0 || !pathf(path, sizeof path, "%s/%s.dead", procs, pidname)) {
        return 0;
    }
    long long seen = -1;
    if (read_small(path, buf, sizeof buf) > 0) {
        char *end;
        long long v = strtoll(buf, &end, 10);
        if (end != buf) {
            seen = v;
        }
    }
    if (seen < 0) {
        /* First sighting: O_EXCL so concurrent readers agree on one time. */
        seen = now_ms();
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            int k = snprintf(buf, sizeof buf, "%lld\n", seen);
            if (write(fd, buf, (size_t)k) != k) {
                /* A short write leaves an unreadable marker; it is retried. */
            }
            close(fd);
        }
        return 1;
    }
    return now_ms() - seen < delay;
}

/* load_uses scans DIR/procs and appends the live (or still held) uses.
 * Returns the number of entries written to uses. */
static int load_uses(const char *dir, fake_use *uses, int max)
{
    char procs[PATH_MAX];
    if (!pathf(procs, sizeof procs, "%s/procs", dir)) {
        return 0;
    }
    DIR *d = opendir(procs);
    if (d == NULL) {
        return 0;
    }
    long long delay = -1; /* read when the first dead pid turns up */
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        const char *nm = e->d_name;
        size_t i = 0;
        while (isdigit((unsigned char)nm[i])) {
            i++;
        }
        if (i == 0 || nm[i] != '\0' || i > 10) {
            continue; /* ".", "..", "<pid>.dead", temp files */
        }
        unsigned long long pidv = strtoull(nm, NULL, 10);
        if (pidv == 0 || pidv > UINT_MAX) {
            continue;
        }
        unsigned int pid = (unsigned int)pidv;
        if (!pid_alive(pid)) {
            if (delay < 0 && (!read_int_file(dir, "release_delay_ms", &delay) || delay < 0)) {
                delay = 0;
            }
            if (!dead_still_held(procs, nm, delay)) {
                char path[PATH_MAX];
                if (pathf(path, sizeof path, "%s/%s", procs, nm)) {
                    unlink(path);
                }
                if (pathf(path, sizeof path, "%s/%s.dead", procs, nm) && unlink(path) == 0 && delay > 0) {
                    /* The held memory is let go now: say when (DIR/released),
                     * so that a test can tell a wait that lasted until then. */
                    char rel[PATH_MAX], line[64];
                    if (pathf(rel, sizeof rel, "%s/released", dir)) {
                        int fd = open(rel, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
                        if (fd >= 0) {
                            int k = snprintf(line, sizeof line, "%s %lld\n", nm, now_ms());
                            if (write(fd, line, (size_t)k) != k) {
                                /* best effort: a test that needs it fails on its absence */
                            }
                            close(fd);
                        }
                    }
                }
                continue;
            }
        }
        char path[PATH_MAX], buf[4096];
        if (!pathf(path, sizeof path, "%s/%s", procs, nm) || read_small(path, buf, sizeof buf) < 0) {
            continue;
        }
        char *save = NULL;
        for (char *line = strtok_r(buf, "\n", &save); line != NULL && n < max;
             line = strtok_r(NULL, "\n", &save)) {
            unsigned long long dev, used;
            char *s = parse_u64(line, &dev);
            if (s == NULL || dev >= FAKE_MAX_DEVICES) {
                continue;
            }
            /* Tolerate a trailing '\r' or spaces after the byte count. */
            size_t len = strlen(s);
            while (len > 0 && (s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t')) {
                s[--len] = '\0';
            }
            if (parse_u64(s, &used) == NULL) {
                continue;
            }
            uses[n].pid = pid;
            uses[n].device = (int)dev;
            uses[n].used = used;
            n++;
        }
    }
    closedir(d);
    return n;
}

static int device_lost(const char *dir, int index);

/* device_of resolves a handle against the current devices file; a device
 * DIR/health marks lost answers NVML_ERROR_GPU_IS_LOST, as the driver does
 * for every query once a GPU has fallen off the bus. */
static nvmlReturn_t device_of(nvmlDevice_t device, char *dir, size_t dirlen,
                              fake_device *devs, int *ndevs, int *index)
{
    nvmlReturn_t ret = state_dir(dir, dirlen);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    struct nvmlDevice_st *h = device.handle;
    if (h < g_handles || h >= g_handles + FAKE_MAX_DEVICES) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *ndevs = load_devices(dir, devs);
    *index = (int)(h - g_handles);
    if (*index >= *ndevs || device_lost(dir, *index)) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

/* Per-device totals and process list, the core of memory and process queries. */
typedef struct {
    fake_device dev;
    unsigned long long used; /* sum over live processes */
    unsigned int npids;
    unsigned int pids[FAKE_MAX_PROCS];
    unsigned long long bytes[FAKE_MAX_PROCS];
} device_usage;

static nvmlReturn_t usage_of(nvmlDevice_t device, device_usage *u)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    int ndevs, index;
    nvmlReturn_t ret = device_of(device, dir, sizeof dir, devs, &ndevs, &index);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if ((ret = fault_of(dir)) != NVML_SUCCESS) {
        return ret;
    }
    u->dev = devs[index];
    u->used = 0;
    u->npids = 0;
    static const int max = FAKE_MAX_PROCS;
    fake_use *uses = malloc(sizeof(fake_use) * (size_t)max);
    if (uses == NULL) {
        return NVML_ERROR_MEMORY;
    }
    int n = load_uses(dir, uses, max);
    for (int i = 0; i < n; i++) {
        if (uses[i].device != index) {
            continue;
        }
        u->used += uses[i].used;
        unsigned int k;
        for (k = 0; k < u->npids && u->pids[k] != uses[i].pid; k++) {
        }
        if (k == u->npids) {
            if (u->npids == FAKE_MAX_PROCS) {
                continue;
            }
            u->pids[k] = uses[i].pid;
            u->bytes[k] = 0;
            u->npids++;
        }
        u->bytes[k] += uses[i].used;
    }
    free(uses);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / errors ------------------------------------------ */

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    const char *dir = getenv("FAKENVML_STATE");
    if (dir == NULL || *dir == '\0') {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (strlen(dir) >= sizeof g_dir - 64) {
        return NVML_ERROR_INVALID_ARGUMENT; /* no room for the state file names */
    }
    long long v;
    if (read_int_file(dir, "init_fault", &v) && v != 0) {
        return (nvmlReturn_t)v;
    }
    pthread_mutex_lock(&g_mu);
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    g_refcount++;
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t DECLDIR nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (--g_refcount == 0) {
        forget_pidfds();
    }
    pthread_mutex_unlock(&g_mu);
    return ret;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    default: return "Unknown Error";
    }
}

/* ---- system ------------------------------------------------------------ */

static nvmlReturn_t copy_str(char *dst, unsigned int n, const char *src)
{
    if (dst == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    size_t len = strlen(src);
    if ((size_t)n < len + 1) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, len + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    char dir[PATH_MAX], path[PATH_MAX], buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (!pathf(path, sizeof path, "%s/driver_version", dir) || read_small(path, buf, sizeof buf) <= 0) {
        snprintf(buf, sizeof buf, "%s", "550.54.15");
    }
    buf[strcspn(buf, "\r\n")] = '\0';
    return copy_str(version, length, buf);
}

nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char dir[PATH_MAX];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    return copy_str(version, length, "12.550.54.15");
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    char dir[PATH_MAX];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (cudaDriverVersion == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *cudaDriverVersion = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices ----------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (deviceCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *deviceCount = (unsigned int)load_devices(dir, devs);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (device == NULL || index >= (unsigned int)load_devices(dir, devs)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    device->handle = &g_handles[index];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (uuid == NULL || device == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    int n = load_devices(dir, devs);
    for (int i = 0; i < n; i++) {
        if (strcmp(devs[i].uuid, uuid) == 0) {
            device->handle = &g_handles[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    int n, index;
    nvmlReturn_t ret = device_of(device, dir, sizeof dir, devs, &n, &index);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    return copy_str(uuid, length, devs[index].uuid);
}

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    int n, index;
    nvmlReturn_t ret = device_of(device, dir, sizeof dir, devs, &n, &index);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    return copy_str(name, length, devs[index].name);
}

nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    int n, i;
    nvmlReturn_t ret = device_of(device, dir, sizeof dir, devs, &n, &i);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (index == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *index = (unsigned int)i;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return nvmlDeviceGetIndex(device, minorNumber);
}

/* ---- memory ------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    device_usage *u = malloc(sizeof *u);
    if (u == NULL) {
        return NVML_ERROR_MEMORY;
    }
    nvmlReturn_t ret = usage_of(device, u);
    if (ret == NVML_SUCCESS) {
        unsigned long long used = u->dev.reserved + u->used;
        memory->total = u->dev.total;
        memory->used = used; /* as is, even above total: the "impossible numbers" fault */
        memory->free = used >= u->dev.total ? 0 : u->dev.total - used;
    }
    free(u);
    return ret;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (memory == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (memory->version != nvmlMemory_v2) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    device_usage *u = malloc(sizeof *u);
    if (u == NULL) {
        return NVML_ERROR_MEMORY;
    }
    nvmlReturn_t ret = usage_of(device, u);
    if (ret == NVML_SUCCESS) {
        unsigned long long taken = u->dev.reserved + u->used;
        memory->total = u->dev.total;
        memory->reserved = u->dev.reserved;
        memory->used = u->used;
        memory->free = taken >= u->dev.total ? 0 : u->dev.total - taken;
    }
    free(u);
    return ret;
}

/* ---- processes --------------------------------------------------------- */

/*
 * The running-processes query is a two-call protocol: ask with too small a
 * buffer, get NVML_ERROR_INSUFFICIENT_SIZE and the count, ask again. The
 * list scanned for the first call is kept (per thread, for a moment) and
 * answers the second, so one logical query reads the state folder once,
 * as one consistent list.
 */
typedef struct {
    struct nvmlDevice_st *handle;
    long long at_us;
    device_usage *u;
} pending_list;

static pthread_key_t g_pending_key;
static pthread_once_t g_pending_once = PTHREAD_ONCE_INIT;

static void free_pending(void *p)
{
    pending_list *pl = p;
    if (pl != NULL) {
        free(pl->u);
        free(pl);
    }
}

static void make_pending_key(void) { (void)pthread_key_create(&g_pending_key, free_pending); }

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

#define FAKE_PENDING_US 1000

/* take_pending returns the list kept for this thread and device, if fresh. */
static device_usage *take_pending(nvmlDevice_t device)
{
    pthread_once(&g_pending_once, make_pending_key);
    pending_list *pl = pthread_getspecific(g_pending_key);
    if (pl == NULL || pl->u == NULL) {
        return NULL;
    }
    device_usage *u = pl->u;
    pl->u = NULL;
    if (pl->handle != device.handle || now_us() - pl->at_us > FAKE_PENDING_US) {
        free(u);
        return NULL;
    }
    return u;
}

static void keep_pending(nvmlDevice_t device, device_usage *u)
{
    pthread_once(&g_pending_once, make_pending_key);
    pending_list *pl = pthread_getspecific(g_pending_key);
    if (pl == NULL) {
        pl = calloc(1, sizeof *pl);
        if (pl == NULL || pthread_setspecific(g_pending_key, pl) != 0) {
            free(pl);
            free(u);
            return;
        }
    }
    free(pl->u);
    pl->handle = device.handle;
    pl->at_us = now_us();
    pl->u = u;
}

/* processes implements the NVML_ERROR_INSUFFICIENT_SIZE protocol shared by
 * every version of the running-processes query; fill writes entry i. */
typedef void (*fill_fn)(void *infos, unsigned int i, unsigned int pid, unsigned long long used);

static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, fill_fn fill)
{
    if (infoCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    nvmlReturn_t ret = NVML_SUCCESS;
    device_usage *u = take_pending(device);
    if (u == NULL) {
        u = malloc(sizeof *u);
        if (u == NULL) {
            return NVML_ERROR_MEMORY;
        }
        ret = usage_of(device, u);
    }
    if (ret == NVML_SUCCESS) {
        if (*infoCount < u->npids) {
            *infoCount = u->npids;
            keep_pending(device, u);
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        if (u->npids > 0 && infos == NULL) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            for (unsigned int i = 0; i < u->npids; i++) {
                fill(infos, i, u->pids[i], u->bytes[i]);
            }
            *infoCount = u->npids;
        }
    }
    free(u);
    return ret;
}

static void fill_v1(void *infos, unsigned int i, unsigned int pid, unsigned long long used)
{
    nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
    p->pid = pid;
    p->usedGpuMemory = used;
}

static void fill_v2(void *infos, unsigned int i, unsigned int pid, unsigned long long used)
{
    nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
    p->pid = pid;
    p->usedGpuMemory = used;
    p->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
    p->computeInstanceId = 0xFFFFFFFFu;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    return processes(device, infoCount, infos, fill_v2);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    return processes(device, infoCount, infos, fill_v2);
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos)
{
    return processes(device, infoCount, infos, fill_v1);
}

/* The stand-in has no graphics or MPS clients: empty lists, same protocol. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount)
{
    char dir[PATH_MAX];
    fake_device devs[FAKE_MAX_DEVICES];
    int n, index;
    nvmlReturn_t ret = device_of(device, dir, sizeof dir, devs, &n, &index);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (infoCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if ((ret = fault_of(dir)) != NVML_SUCCESS) {
        return ret;
    }
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

/* ---- health: ECC, row remapping, retired pages, a lost GPU -------------- */

#define FAKE_UNSUP_ECC 1u
#define FAKE_UNSUP_REMAP 2u
#define FAKE_UNSUP_RETIRED 4u
#define FAKE_UNSUP_EVENTS 8u
#define FAKE_UNSUP_THROTTLE 16u

typedef struct {
    int lost;
    unsigned long long ecc[2][2]; /* [nvmlMemoryErrorType_t][nvmlEccCounterType_t] */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    int retired_pending;
    unsigned long long throttle; /* clock event reasons mask */
    unsigned int unsupported;    /* FAKE_UNSUP_* */
} fake_health;

/* load_health reads device index's lines of DIR/health (all zero when the
 * file is absent). Malformed lines are skipped. */
static void load_health(const char *dir, int index, fake_health *h)
{
    memset(h, 0, sizeof *h);
    char path[PATH_MAX];
    if (!pathf(path, sizeof path, "%s/health", dir)) {
        return;
    }
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        return;
    }
    char line[256];
    while (fgets(line, sizeof line, f) != NULL) {
        int dev;
        char key[64], val[64];
        if (line[0] == '#' || sscanf(line, "%d %63s %63s", &dev, key, val) != 3 || dev != index) {
            continue;
        }
        if (strcmp(key, "unsupported") == 0) {
            if (strcmp(val, "ecc") == 0) {
                h->unsupported |= FAKE_UNSUP_ECC;
            } else if (strcmp(val, "remap") == 0) {
                h->unsupported |= FAKE_UNSUP_REMAP;
            } else if (strcmp(val, "retired") == 0) {
                h->unsupported |= FAKE_UNSUP_RETIRED;
            } else if (strcmp(val, "events") == 0) {
                h->unsupported |= FAKE_UNSUP_EVENTS;
            } else if (strcmp(val, "throttle") == 0) {
                h->unsupported |= FAKE_UNSUP_THROTTLE;
            }
            continue;
        }
        char *end;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (end == val || *end != '\0' || errno != 0) {
            continue;
        }
        if (strcmp(key, "lost") == 0) {
            h->lost = v != 0;
        } else if (strcmp(key, "ecc_volatile_corrected") == 0) {
            h->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_VOLATILE_ECC] = v;
        } else if (strcmp(key, "ecc_aggregate_corrected") == 0) {
            h->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_AGGREGATE_ECC] = v;
        } else if (strcmp(key, "ecc_volatile_uncorrected") == 0) {
            h->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_VOLATILE_ECC] = v;
        } else if (strcmp(key, "ecc_aggregate_uncorrected") == 0) {
            h->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_AGGREGATE_ECC] = v;
        } else if (strcmp(key, "remap_corr") == 0) {
            h->remap_corr = (unsigned int)v;
        } else if (strcmp(key, "remap_unc") == 0) {
            h->remap_unc = (unsigned int)v;
        } else if (strcmp(key, "remap_pending") == 0) {
            h->remap_pending = v != 0;
        } else if (strcmp(key, "remap_failure") == 0) {
            h->remap_failure = v != 0;
        } else if (strcmp(key, "retired_pending") == 0) {
            h->retired_pending = v != 0;
        } else if (strcmp(key, "throttle") == 0) {
            h->throttle = v;
        }
    }
    fclose(f);
}

static int device_lost(const char *dir, int index)
{
    fake_health h;
    load_health(dir, index, &h);
    return h.lost;
}

/* health_of resolves device and loads its health. */
static nvmlReturn_t health_of(nvmlDevice_t device, fake_health *h, int *index, char *dir, size_t dirlen)
{
    fake_device devs[FAKE_MAX_DEVICES];
    int n;
    nvmlReturn_t ret = device_of(device, dir, dirlen, devs, &n, index);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    load_health(dir, *index, h);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (eccCounts == NULL || (unsigned)errorType > 1 || (unsigned)counterType > 1) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (h.unsupported & FAKE_UNSUP_ECC) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *eccCounts = h.ecc[errorType][counterType];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                               unsigned int *isPending, unsigned int *failureOccurred)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (h.unsupported & FAKE_UNSUP_REMAP) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *corrRows = h.remap_corr;
    *uncRows = h.remap_unc;
    *isPending = h.remap_pending;
    *failureOccurred = h.remap_failure;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (isPending == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (h.unsupported & FAKE_UNSUP_RETIRED) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *isPending = h.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- events: XID and ECC ------------------------------------------------ */

#define FAKE_MAX_SETS 16
#define FAKE_EVENT_TYPES (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError)

struct nvmlEventSet_st {
    int used;
    long long offset;                             /* bytes of DIR/events already consumed */
    unsigned long long types[FAKE_MAX_DEVICES];  /* registered event types, by device */
};

static struct nvmlEventSet_st g_sets[FAKE_MAX_SETS]; /* guarded by g_mu */

static unsigned long long supported_events(const fake_health *h)
{
    if (h->unsupported & FAKE_UNSUP_EVENTS) {
        return 0;
    }
    if (h->unsupported & FAKE_UNSUP_ECC) {
        return nvmlEventTypeXidCriticalError;
    }
    return FAKE_EVENT_TYPES;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (eventTypes == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *eventTypes = supported_events(&h);
    return NVML_SUCCESS;
}

static long long events_size(const char *dir)
{
    char path[PATH_MAX];
    struct stat st;
    if (!pathf(path, sizeof path, "%s/events", dir) || stat(path, &st) != 0) {
        return 0;
    }
    return (long long)st.st_size;
}

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
    char dir[PATH_MAX];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (set == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    long long off = events_size(dir);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < FAKE_MAX_SETS; i++) {
        if (!g_sets[i].used) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].used = 1;
            g_sets[i].offset = off;
            set->handle = &g_sets[i];
            pthread_mutex_unlock(&g_mu);
            return NVML_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return NVML_ERROR_MEMORY;
}

/* set_of checks a set handle (g_mu held). */
static struct nvmlEventSet_st *set_of(nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s = set.handle;
    if (s < g_sets || s >= g_sets + FAKE_MAX_SETS || !s->used) {
        return NULL;
    }
    return s;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
    char dir[PATH_MAX];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    pthread_mutex_lock(&g_mu);
    struct nvmlEventSet_st *s = set_of(set);
    if (s != NULL) {
        s->used = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return s == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if ((eventTypes & ~supported_events(&h)) != 0) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&g_mu);
    struct nvmlEventSet_st *s = set_of(set);
    if (s != NULL) {
        s->types[index] |= eventTypes;
    }
    pthread_mutex_unlock(&g_mu);
    return s == NULL ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

/* next_event reads DIR/events from the set's offset and returns 1 with data
 * filled for the first complete line the set registered; every complete
 * line read is consumed. */
static int next_event(const char *dir, struct nvmlEventSet_st *s, nvmlEventData_t *data)
{
    char path[PATH_MAX];
    if (!pathf(path, sizeof path, "%s/events", dir)) {
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    pthread_mutex_lock(&g_mu);
    long long off = s->offset;
    unsigned long long types[FAKE_MAX_DEVICES];
    memcpy(types, s->types, sizeof types);
    pthread_mutex_unlock(&g_mu);
    char buf[4096];
    ssize_t n = pread(fd, buf, sizeof buf - 1, (off_t)off);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    int found = 0;
    char *p = buf;
    for (;;) {
        char *nl = strchr(p, '\n');
        if (nl == NULL) {
            if (p == buf && (size_t)n == sizeof buf - 1) {
                off += n; /* a line longer than the buffer: skipped, not waited on forever */
            }
            break; /* a line still being written */
        }
        *nl = '\0';
        off += (long long)(nl - p) + 1;
        int dev;
        char kind[16];
        unsigned long long xid = 0;
        int k = sscanf(p, "%d %15s %llu", &dev, kind, &xid);
        p = nl + 1;
        if (k < 2 || dev < 0 || dev >= FAKE_MAX_DEVICES) {
            continue;
        }
        unsigned long long type = 0;
        if (strcmp(kind, "xid") == 0 && k == 3) {
            type = nvmlEventTypeXidCriticalError;
        } else if (strcmp(kind, "dbe") == 0) {
            type = nvmlEventTypeDoubleBitEccError;
            xid = 0;
        } else if (strcmp(kind, "sbe") == 0) {
            type = nvmlEventTypeSingleBitEccError;
            xid = 0;
        }
        if (type == 0 || (types[dev] & type) == 0) {
            continue;
        }
        data->device.handle = &g_handles[dev];
        data->eventType = type;
        data->eventData = xid;
        data->gpuInstanceId = 0xFFFFFFFFu;
        data->computeInstanceId = 0xFFFFFFFFu;
        found = 1;
        break;
    }
    pthread_mutex_lock(&g_mu);
    if (s->used && s->offset < off) {
        s->offset = off;
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    char dir[PATH_MAX];
    nvmlReturn_t ret = state_dir(dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (data == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_mu);
    struct nvmlEventSet_st *s = set_of(set);
    pthread_mutex_unlock(&g_mu);
    if (s == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    long long deadline = now_ms() + timeoutms;
    for (;;) {
        if (next_event(dir, s, data)) {
            return NVML_SUCCESS;
        }
        if (now_ms() >= deadline) {
            return NVML_ERROR_TIMEOUT;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ---- clock event (throttle) reasons ------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons)
{
    char dir[PATH_MAX];
    fake_health h;
    int index;
    nvmlReturn_t ret = health_of(device, &h, &index, dir, sizeof dir);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (clocksEventReasons == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (h.unsupported & FAKE_UNSUP_THROTTLE) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *clocksEventReasons = h.throttle;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, clocksThrottleReasons);
}
