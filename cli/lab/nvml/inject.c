/*
 * NVML injection library: serves NVIDIA's NVML C API from a scenario file so the real,
 * unmodified pynvml (and anything else that dlopens libnvidia-ml.so.1) can be tested
 * without a GPU. Compiled against NVIDIA's own nvml.h, so gcc checks every signature.
 *
 * Scenario file: NVML_INJECT_SCENARIO ("{node}" -> MEDIC_NODE_NAME, else SLURMD_NODENAME),
 * "key=value" lines written by cli/lab/scenario/. It is re-read whenever its identity
 * (inode, size, mtime) changes, so faults reach a running process. See docs/nvml-injection.md.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_PROCS 32
#define MAX_EVENTS 1024
#define MAX_RULES 256
#define MAX_LINKS NVML_NVLINK_MAX_LINKS
#define POLL_NS 20000000L /* 20 ms: event waits and hangs re-check the scenario this often */
#define MIB (1024ULL * 1024ULL)
#define NO_INSTANCE 0xFFFFFFFFu

typedef struct {
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char serial[NVML_DEVICE_SERIAL_BUFFER_SIZE];
    char pci[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    char vbios[NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE];
    char inforom_image[NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE];
    unsigned int domain, bus, device;
    unsigned int pci_device_id, pci_subsystem_id, minor;
    unsigned long long memory_total_mib, memory_reserved_mib;
    unsigned int temperature, power_mw, util_gpu, util_mem;
    unsigned long long throttle;
    unsigned int ecc_mode;
    unsigned long long ecc[2][2]; /* [sbe=0|dbe=1][volatile=0|aggregate=1] */
    unsigned int retired[2];      /* pages by cause: [multiple sbe, dbe] */
    unsigned int retired_pending;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int nvlinks, nvlink_down; /* nvlink_down: bitmask over link numbers */
    unsigned int pcie_gen, pcie_width, pcie_max_gen, pcie_max_width;
    unsigned int persistence, lost, missing;
    unsigned int pcie_replay;                          /* PCIe replay counter */
    unsigned long long nvlink_err[NVML_NVLINK_ERROR_COUNT]; /* per GPU, reported on link 0 */
    unsigned long long violation_ns[2];                /* [power=0|thermal=1] since load */
    unsigned int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mib[MAX_PROCS];
} gpu_state;

typedef struct {
    unsigned int gpu;
    unsigned long long seq, xid;
} xid_event;

typedef struct {
    char fn[64];
    int gpu; /* -1: every GPU and node-wide calls */
    double value;
} rule;

typedef struct {
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char nvml[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    int cuda;
    unsigned int ngpus;
    gpu_state gpu[MAX_GPUS];
    unsigned int nevents, nfails, nhangs;
    xid_event events[MAX_EVENTS];
    rule fails[MAX_RULES], hangs[MAX_RULES];
} scenario;

struct nvmlDevice_st {
    unsigned int slot;
};

struct nvmlEventSet_st {
    unsigned long long mask[MAX_GPUS];
    unsigned long long last_seq[MAX_GPUS];
    unsigned long long last_dbe[MAX_GPUS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlDevice_st g_handles[MAX_GPUS];
static unsigned int g_refcount;
static char g_path[4096];
static scenario *g_sc;
static struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int valid;
} g_file;

/* ---- scenario parsing --------------------------------------------------------------- */

static int parse_uint(const char *s, unsigned long long *out)
{
    char *end;
    if (*s == '\0' || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end) ? -1 : 0;
}

static int parse_u32(const char *s, unsigned int *out)
{
    unsigned long long v;
    if (parse_uint(s, &v) || v > 0xFFFFFFFFULL)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int copy_str(char *dst, size_t size, const char *src)
{
    if (strlen(src) >= size)
        return -1;
    strcpy(dst, src);
    return 0;
}

/* "3,7" -> bit 3 | bit 7 */
static int parse_link_list(const char *s, unsigned int *mask)
{
    char buf[256], *save = NULL, *tok;
    unsigned int link;
    *mask = 0;
    if (copy_str(buf, sizeof buf, s))
        return -1;
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (parse_u32(tok, &link) || link >= 32)
            return -1;
        *mask |= 1u << link;
    }
    return 0;
}

/* "pid:MiB,pid:MiB" */
static int parse_processes(const char *s, gpu_state *g)
{
    char buf[2048], *save = NULL, *tok, *colon;
    g->nprocs = 0;
    if (copy_str(buf, sizeof buf, s))
        return -1;
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        colon = strchr(tok, ':');
        if (!colon || g->nprocs >= MAX_PROCS)
            return -1;
        *colon = '\0';
        if (parse_u32(tok, &g->proc_pid[g->nprocs]) ||
            parse_uint(colon + 1, &g->proc_mib[g->nprocs]))
            return -1;
        g->nprocs++;
    }
    return 0;
}

static int add_rule(rule *rules, unsigned int *n, const char *fn, int gpu, const char *value)
{
    char *end;
    double v;
    if (*n >= MAX_RULES || copy_str(rules[*n].fn, sizeof rules[*n].fn, fn))
        return -1;
    v = strtod(value, &end);
    if (*end || end == value)
        return -1;
    rules[*n].gpu = gpu;
    rules[*n].value = v;
    (*n)++;
    return 0;
}

#define U32_FIELD(k, f) \
    if (!strcmp(field, k)) \
        return parse_u32(value, &g->f)
#define U64_FIELD(k, f) \
    if (!strcmp(field, k)) \
        return parse_uint(value, &g->f)

static int parse_gpu_field(scenario *sc, unsigned int slot, const char *field, const char *value)
{
    gpu_state *g = &sc->gpu[slot];
    unsigned long long seq;

    if (!strcmp(field, "name"))
        return copy_str(g->name, sizeof g->name, value);
    if (!strcmp(field, "uuid"))
        return copy_str(g->uuid, sizeof g->uuid, value);
    if (!strcmp(field, "serial"))
        return copy_str(g->serial, sizeof g->serial, value);
    if (!strcmp(field, "vbios"))
        return copy_str(g->vbios, sizeof g->vbios, value);
    if (!strcmp(field, "inforom_image"))
        return copy_str(g->inforom_image, sizeof g->inforom_image, value);
    if (!strcmp(field, "pci")) {
        unsigned int fn;
        if (copy_str(g->pci, sizeof g->pci, value))
            return -1;
        return sscanf(value, "%x:%x:%x.%x", &g->domain, &g->bus, &g->device, &fn) == 4 ? 0 : -1;
    }
    if (!strcmp(field, "nvlink_down"))
        return parse_link_list(value, &g->nvlink_down);
    if (!strcmp(field, "processes"))
        return parse_processes(value, g);
    if (!strncmp(field, "xid.", 4)) {
        if (sc->nevents >= MAX_EVENTS || parse_uint(field + 4, &seq))
            return -1;
        sc->events[sc->nevents].gpu = slot;
        sc->events[sc->nevents].seq = seq;
        sc->nevents++;
        return parse_uint(value, &sc->events[sc->nevents - 1].xid);
    }
    if (!strncmp(field, "fail.", 5))
        return add_rule(sc->fails, &sc->nfails, field + 5, (int)slot, value);
    if (!strncmp(field, "hang.", 5))
        return add_rule(sc->hangs, &sc->nhangs, field + 5, (int)slot, value);
    /* Python-side bookkeeping (what a repair clears, the lab's dcgmi); not NVML's. */
    if (!strcmp(field, "hardware_fault") || !strcmp(field, "recoverable_by") ||
        !strcmp(field, "dcgm_diag"))
        return 0;
    U32_FIELD("pci_device_id", pci_device_id);
    U32_FIELD("pci_subsystem_id", pci_subsystem_id);
    U32_FIELD("minor", minor);
    U64_FIELD("memory_total_mib", memory_total_mib);
    U64_FIELD("memory_reserved_mib", memory_reserved_mib);
    U32_FIELD("temperature", temperature);
    U32_FIELD("power_mw", power_mw);
    U32_FIELD("util_gpu", util_gpu);
    U32_FIELD("util_mem", util_mem);
    U64_FIELD("throttle", throttle);
    U32_FIELD("ecc_mode", ecc_mode);
    U64_FIELD("ecc.volatile.sbe", ecc[0][0]);
    U64_FIELD("ecc.aggregate.sbe", ecc[0][1]);
    U64_FIELD("ecc.volatile.dbe", ecc[1][0]);
    U64_FIELD("ecc.aggregate.dbe", ecc[1][1]);
    U32_FIELD("retired.sbe", retired[0]);
    U32_FIELD("retired.dbe", retired[1]);
    U32_FIELD("retired.pending", retired_pending);
    U32_FIELD("remap.correctable", remap_corr);
    U32_FIELD("remap.uncorrectable", remap_unc);
    U32_FIELD("remap.pending", remap_pending);
    U32_FIELD("remap.failure", remap_failure);
    U32_FIELD("nvlinks", nvlinks);
    U32_FIELD("pcie.gen", pcie_gen);
    U32_FIELD("pcie.width", pcie_width);
    U32_FIELD("pcie.max_gen", pcie_max_gen);
    U32_FIELD("pcie.max_width", pcie_max_width);
    U32_FIELD("persistence", persistence);
    U32_FIELD("pcie.replay", pcie_replay);
    U64_FIELD("nvlink.replay", nvlink_err[NVML_NVLINK_ERROR_DL_REPLAY]);
    U64_FIELD("nvlink.recovery", nvlink_err[NVML_NVLINK_ERROR_DL_RECOVERY]);
    U64_FIELD("nvlink.crc_flit", nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT]);
    U64_FIELD("nvlink.crc_data", nvlink_err[NVML_NVLINK_ERROR_DL_CRC_DATA]);
    U64_FIELD("violation.power_ns", violation_ns[0]);
    U64_FIELD("violation.thermal_ns", violation_ns[1]);
    U32_FIELD("lost", lost);
    U32_FIELD("missing", missing);
    return -1;
}

static int parse_line(scenario *sc, char *key, const char *value)
{
    unsigned long long v;
    char *dot;

    if (!strcmp(key, "version"))
        return strcmp(value, "1") ? -1 : 0;
    if (!strcmp(key, "node") || !strcmp(key, "event_seq"))
        return 0;
    if (!strcmp(key, "driver"))
        return copy_str(sc->driver, sizeof sc->driver, value);
    if (!strcmp(key, "nvml"))
        return copy_str(sc->nvml, sizeof sc->nvml, value);
    if (!strcmp(key, "cuda")) {
        if (parse_uint(value, &v) || v > 1000000)
            return -1;
        sc->cuda = (int)v;
        return 0;
    }
    if (!strcmp(key, "gpus")) {
        if (parse_uint(value, &v) || v > MAX_GPUS)
            return -1;
        sc->ngpus = (unsigned int)v;
        return 0;
    }
    if (!strncmp(key, "fail.", 5))
        return add_rule(sc->fails, &sc->nfails, key + 5, -1, value);
    if (!strncmp(key, "hang.", 5))
        return add_rule(sc->hangs, &sc->nhangs, key + 5, -1, value);
    if (!strncmp(key, "gpu.", 4)) {
        dot = strchr(key + 4, '.');
        if (!dot)
            return -1;
        *dot = '\0';
        if (parse_uint(key + 4, &v) || v >= MAX_GPUS || v >= sc->ngpus)
            return -1;
        return parse_gpu_field(sc, (unsigned int)v, dot + 1, value);
    }
    return -1;
}

static char *strip(char *s)
{
    char *end;
    while (*s == ' ' || *s == '\t')
        s++;
    end = s + strlen(s);
    while (end > s && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    return s;
}

/* 0 on success; otherwise a reason in err. "gpus=" must come before "gpu.N." lines. */
static int parse_file(const char *path, scenario *sc, char *err, size_t errlen)
{
    char line[4096], *key, *eq;
    unsigned int lineno = 0;
    FILE *f = fopen(path, "r");

    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    memset(sc, 0, sizeof *sc);
    while (fgets(line, sizeof line, f)) {
        lineno++;
        key = strip(line);
        if (*key == '\0' || *key == '#')
            continue;
        eq = strchr(key, '=');
        if (!eq) {
            snprintf(err, errlen, "line %u: expected key=value", lineno);
            fclose(f);
            return -1;
        }
        *eq = '\0';
        if (parse_line(sc, strip(key), strip(eq + 1))) {
            snprintf(err, errlen, "line %u: bad entry for key '%.64s'", lineno, key);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    if (sc->driver[0] == '\0') {
        snprintf(err, errlen, "no driver= line (not a scenario file?)");
        return -1;
    }
    return 0;
}

/* ---- scenario loading (callers hold g_lock) ----------------------------------------- */

static void resolve_path(void)
{
    const char *tmpl = getenv("NVML_INJECT_SCENARIO");
    const char *node = getenv("MEDIC_NODE_NAME");
    const char *mark;
    if (!node || !*node)
        node = getenv("SLURMD_NODENAME");
    if (!node)
        node = "";
    if (!tmpl) {
        g_path[0] = '\0';
        return;
    }
    mark = strstr(tmpl, "{node}");
    if (mark)
        snprintf(g_path, sizeof g_path, "%.*s%s%s", (int)(mark - tmpl), tmpl, node, mark + 6);
    else
        snprintf(g_path, sizeof g_path, "%s", tmpl);
}

static int same_file(const struct stat *st)
{
    return g_file.valid && g_file.dev == st->st_dev && g_file.ino == st->st_ino &&
           g_file.size == st->st_size && g_file.mtime.tv_sec == st->st_mtim.tv_sec &&
           g_file.mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* Loads the file if it changed. 0: current scenario is usable; -1: reason in err. */
static int refresh_locked(char *err, size_t errlen)
{
    struct stat st;
    scenario *next;

    if (stat(g_path, &st) != 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        return g_sc ? 0 : -1;
    }
    if (same_file(&st) && g_sc)
        return 0;
    /* Record the identity even if parsing fails, so a bad file is not re-parsed per call. */
    g_file.dev = st.st_dev;
    g_file.ino = st.st_ino;
    g_file.size = st.st_size;
    g_file.mtime = st.st_mtim;
    g_file.valid = 1;
    next = malloc(sizeof *next);
    if (!next) {
        snprintf(err, errlen, "out of memory");
        return g_sc ? 0 : -1;
    }
    if (parse_file(g_path, next, err, errlen)) {
        free(next);
        if (g_sc)
            fprintf(stderr, "nvml-inject: ignoring bad scenario %s: %s\n", g_path, err);
        return g_sc ? 0 : -1;
    }
    free(g_sc);
    g_sc = next;
    return 0;
}

/* ---- rules, hangs, the common preamble ---------------------------------------------- */

/* A rule names a function exactly, or its unversioned base (nvmlDeviceGetCount matches
 * nvmlDeviceGetCount_v2, nvmlDeviceGetTemperature matches nvmlDeviceGetTemperatureV);
 * "nvmlInit" also matches nvmlInitWithFlags, which is what pynvml's nvmlInit() calls. */
static int rule_matches(const char *rule_fn, const char *fn)
{
    size_t n = strlen(rule_fn);
    if (!strcmp(rule_fn, fn))
        return 1;
    if (strncmp(rule_fn, fn, n))
        return 0;
    fn += n;
    if (!strcmp(rule_fn, "nvmlInit") && !strcmp(fn, "WithFlags"))
        return 1;
    if (!strcmp(fn, "V"))
        return 1;
    if (fn[0] == '_' && fn[1] == 'v' && fn[2] >= '0' && fn[2] <= '9')
        return 1;
    return 0;
}

static const rule *find_rule(const rule *rules, unsigned int n, const char *fn, int slot)
{
    for (unsigned int i = 0; i < n; i++)
        if ((rules[i].gpu < 0 || rules[i].gpu == slot) && rule_matches(rules[i].fn, fn))
            return &rules[i];
    return NULL;
}

static double elapsed_s(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

/* An inotify descriptor on the scenario file's directory (the file is replaced by rename),
 * so an event wait sleeps in poll() like the real driver instead of re-reading the file
 * every POLL_NS; -1 when inotify is unavailable (the wait then falls back to polling). */
static int watch_scenario_dir(void)
{
    char dir[sizeof g_path];
    char *slash;
    int fd;

    pthread_mutex_lock(&g_lock);
    snprintf(dir, sizeof dir, "%s", g_path);
    pthread_mutex_unlock(&g_lock);
    slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0)
        return -1;
    if (inotify_add_watch(fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ATTRIB) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sleeps until the scenario directory changes or ns pass. */
static void wait_for_change(int fd, long ns)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    char buf[4096];

    if (fd < 0) {
        nap(ns < POLL_NS ? ns : POLL_NS);
        return;
    }
    if (poll(&pfd, 1, (int)(ns / 1000000L) + 1) > 0) {
        while (read(fd, buf, sizeof buf) > 0) {
        }
    }
}

static int handle_slot(nvmlDevice_t dev)
{
    if (dev < &g_handles[0] || dev >= &g_handles[MAX_GPUS])
        return -2;
    return (int)(dev - g_handles);
}

/*
 * The top of every exported function: NVML_ERROR_UNINITIALIZED before init, then a
 * `hang.<fn>` sleep (a negative value hangs until the rule is removed; the sleep re-reads
 * the scenario, so removing the rule ends it), then a `fail.<fn>` code, then for a device
 * call the GPU's state (copied out, so callers need no lock) and GPU_IS_LOST.
 */
static nvmlReturn_t begin(const char *fn, int slot, int device_call, gpu_state *out)
{
    struct timespec start;
    const rule *r;
    char err[256];
    int code = 0;

    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_UNINITIALIZED;
        }
        refresh_locked(err, sizeof err);
        r = find_rule(g_sc->hangs, g_sc->nhangs, fn, slot);
        if (r && (r->value < 0 || elapsed_s(&start) < r->value)) {
            pthread_mutex_unlock(&g_lock);
            nap(POLL_NS);
            continue;
        }
        r = find_rule(g_sc->fails, g_sc->nfails, fn, slot);
        code = r ? (int)r->value : 0;
        if (device_call) {
            if (slot < 0 || (unsigned int)slot >= g_sc->ngpus) {
                pthread_mutex_unlock(&g_lock);
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            *out = g_sc->gpu[slot];
        }
        pthread_mutex_unlock(&g_lock);
        break;
    }
    if (code)
        return (nvmlReturn_t)code;
    if (device_call && (out->lost || out->missing))
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define SYSTEM_CALL() \
    do { \
        nvmlReturn_t rc_ = begin(__func__, -1, 0, NULL); \
        if (rc_ != NVML_SUCCESS) \
            return rc_; \
    } while (0)

#define DEVICE_CALL(dev) \
    gpu_state g; \
    do { \
        nvmlReturn_t rc_ = begin(__func__, handle_slot(dev), 1, &g); \
        if (rc_ != NVML_SUCCESS) \
            return rc_; \
    } while (0)

#define REQUIRE(ptr) \
    do { \
        if (!(ptr)) \
            return NVML_ERROR_INVALID_ARGUMENT; \
    } while (0)

static nvmlReturn_t put_str(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / strings ------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    char err[256];
    nvmlReturn_t rc;
    (void)flags;

    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        resolve_path();
        g_file.valid = 0;
        free(g_sc);
        g_sc = NULL;
        if (!g_path[0]) {
            fprintf(stderr, "nvml-inject: NVML_INJECT_SCENARIO is not set\n");
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        if (refresh_locked(err, sizeof err)) {
            fprintf(stderr, "nvml-inject: cannot load scenario %s: %s\n", g_path, err);
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        for (unsigned int i = 0; i < MAX_GPUS; i++)
            g_handles[i].slot = i;
    }
    g_refcount++;
    pthread_mutex_unlock(&g_lock);

    rc = begin(__func__, -1, 0, NULL);
    if (rc != NVML_SUCCESS) {
        pthread_mutex_lock(&g_lock);
        g_refcount--;
        pthread_mutex_unlock(&g_lock);
    }
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    SYSTEM_CALL();
    pthread_mutex_lock(&g_lock);
    if (g_refcount > 0)
        g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
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
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_NOT_READY: return "System is not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system queries ------------------------------------------------------------------ */

static nvmlReturn_t system_string(const char *fn, int which, char *out, unsigned int length)
{
    char value[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    nvmlReturn_t rc = begin(fn, -1, 0, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    snprintf(value, sizeof value, "%s", which ? g_sc->nvml : g_sc->driver);
    pthread_mutex_unlock(&g_lock);
    return put_str(out, length, value);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return system_string(__func__, 0, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return system_string(__func__, 1, version, length);
}

static nvmlReturn_t cuda_version(const char *fn, int *out)
{
    nvmlReturn_t rc = begin(fn, -1, 0, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    REQUIRE(out);
    pthread_mutex_lock(&g_lock);
    *out = g_sc->cuda;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_version(__func__, cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_version(__func__, cudaDriverVersion);
}

/* ---- enumeration and handles --------------------------------------------------------- */

enum lookup_kind { BY_INDEX, BY_UUID, BY_PCI };

static int pci_equal(const char *a, const gpu_state *g)
{
    unsigned int dom, bus, dev, fn;
    if (sscanf(a, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return 0;
    return dom == g->domain && bus == g->bus && dev == g->device && fn == 0;
}

/* Finds the slot of a present (not missing) GPU. Slots are scenario positions; NVML
 * indexes count present GPUs only, so a missing GPU shifts the later indexes down. */
static nvmlReturn_t lookup(const char *fn, enum lookup_kind kind, unsigned int index,
                           const char *key, nvmlDevice_t *device)
{
    gpu_state g;
    int slot = -1;
    unsigned int visible = 0;
    nvmlReturn_t rc = begin(fn, -1, 0, NULL);

    if (rc != NVML_SUCCESS)
        return rc;
    REQUIRE(device);
    REQUIRE(kind == BY_INDEX || key);
    pthread_mutex_lock(&g_lock);
    for (unsigned int i = 0; i < g_sc->ngpus && slot < 0; i++) {
        const gpu_state *s = &g_sc->gpu[i];
        if (s->missing)
            continue;
        if ((kind == BY_INDEX && visible == index) ||
            (kind == BY_UUID && !strcmp(s->uuid, key)) || (kind == BY_PCI && pci_equal(key, s)))
            slot = (int)i;
        visible++;
    }
    pthread_mutex_unlock(&g_lock);
    if (slot < 0)
        return kind == BY_INDEX ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_FOUND;
    /* Per-GPU rules and GPU_IS_LOST apply once the GPU is known. */
    rc = begin(fn, slot, 1, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    *device = &g_handles[slot];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    unsigned int n = 0;
    SYSTEM_CALL();
    REQUIRE(deviceCount);
    pthread_mutex_lock(&g_lock);
    for (unsigned int i = 0; i < g_sc->ngpus; i++)
        n += g_sc->gpu[i].missing ? 0 : 1;
    pthread_mutex_unlock(&g_lock);
    *deviceCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return lookup(__func__, BY_INDEX, index, NULL, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    return lookup(__func__, BY_UUID, 0, uuid, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return lookup(__func__, BY_PCI, 0, pciBusId, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned int visible = 0;
    int slot = handle_slot(device);
    DEVICE_CALL(device);
    REQUIRE(index);
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < slot && (unsigned int)i < g_sc->ngpus; i++)
        visible += g_sc->gpu[i].missing ? 0 : 1;
    pthread_mutex_unlock(&g_lock);
    *index = visible;
    return NVML_SUCCESS;
}

/* ---- identity -------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE_CALL(device);
    REQUIRE(minorNumber);
    *minorNumber = g.minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEVICE_CALL(device);
    return put_str(name, length, g.name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEVICE_CALL(device);
    return put_str(uuid, length, g.uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE_CALL(device);
    return put_str(serial, length, g.serial);
}

/* An empty version (a scenario written before the key existed): the GPU does not say. */
EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                              unsigned int length)
{
    DEVICE_CALL(device);
    return g.vbios[0] ? put_str(version, length, g.vbios) : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                                     unsigned int length)
{
    DEVICE_CALL(device);
    return g.inforom_image[0] ? put_str(version, length, g.inforom_image)
                              : NVML_ERROR_NOT_SUPPORTED;
}

static void fill_pci(const gpu_state *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             g->domain & 0xFFFF, g->bus, g->device);
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, g->domain, g->bus,
             g->device);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_CALL(device);
    REQUIRE(pci);
    fill_pci(&g, pci);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_CALL(device);
    REQUIRE(pci);
    fill_pci(&g, pci);
    return NVML_SUCCESS;
}

/* ---- memory, thermals, power, clocks, utilization -------------------------------------- */

static unsigned long long process_bytes(const gpu_state *g)
{
    unsigned long long total = 0;
    for (unsigned int i = 0; i < g->nprocs; i++)
        total += g->proc_mib[i] * MIB;
    return total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long total, used;
    DEVICE_CALL(device);
    REQUIRE(memory);
    total = g.memory_total_mib * MIB;
    used = g.memory_reserved_mib * MIB + process_bytes(&g);
    memory->total = total;
    memory->used = used > total ? total : used;
    memory->free = total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    unsigned long long total, reserved, used;
    DEVICE_CALL(device);
    REQUIRE(memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    total = g.memory_total_mib * MIB;
    reserved = g.memory_reserved_mib * MIB;
    used = process_bytes(&g);
    if (reserved + used > total)
        used = total - reserved;
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - reserved - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                             nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    DEVICE_CALL(device);
    REQUIRE(temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g.temperature;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEVICE_CALL(device);
    REQUIRE(temperature);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    temperature->temperature = (int)g.temperature;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEVICE_CALL(device);
    REQUIRE(power);
    *power = g.power_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *clocksEventReasons)
{
    DEVICE_CALL(device);
    REQUIRE(clocksEventReasons);
    *clocksEventReasons = g.throttle;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(
    nvmlDevice_t device, unsigned long long *clocksThrottleReasons)
{
    DEVICE_CALL(device);
    REQUIRE(clocksThrottleReasons);
    *clocksThrottleReasons = g.throttle;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization)
{
    DEVICE_CALL(device);
    REQUIRE(utilization);
    utilization->gpu = g.util_gpu;
    utilization->memory = g.util_mem;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEVICE_CALL(device);
    REQUIRE(mode);
    *mode = g.persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- ECC, retired pages, row remapping ------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                         nvmlEnableState_t *pending)
{
    DEVICE_CALL(device);
    REQUIRE(current && pending);
    *current = *pending = g.ecc_mode ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

static nvmlReturn_t ecc_count(const gpu_state *g, nvmlMemoryErrorType_t errorType,
                              nvmlEccCounterType_t counterType, unsigned long long *out)
{
    REQUIRE(out);
    if ((unsigned int)errorType >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned int)counterType >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->ecc_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = g->ecc[errorType][counterType];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType,
                                                unsigned long long *eccCounts)
{
    DEVICE_CALL(device);
    return ecc_count(&g, errorType, counterType, eccCounts);
}

/* The scenario's counts are all device memory (DRAM); the on-chip SRAM locations read 0. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device,
                                                    nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType,
                                                    nvmlMemoryLocation_t locationType,
                                                    unsigned long long *count)
{
    nvmlReturn_t rc;
    DEVICE_CALL(device);
    rc = ecc_count(&g, errorType, counterType, count);
    if (rc != NVML_SUCCESS)
        return rc;
    switch (locationType) {
    case NVML_MEMORY_LOCATION_DEVICE_MEMORY: return NVML_SUCCESS;
    case NVML_MEMORY_LOCATION_L1_CACHE:
    case NVML_MEMORY_LOCATION_L2_CACHE:
    case NVML_MEMORY_LOCATION_REGISTER_FILE:
    case NVML_MEMORY_LOCATION_SRAM: *count = 0; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

static nvmlReturn_t retired_pages(const gpu_state *g, unsigned int slot,
                                  nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps)
{
    unsigned int n;
    REQUIRE(pageCount);
    if ((unsigned int)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    n = g->retired[cause];
    if (*pageCount < n || (n && !addresses)) {
        *pageCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    /* Synthetic but stable addresses and timestamps, distinct per GPU and cause. */
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = 0x100000ULL * (slot + 1) + 0x1000ULL * (i + 1) + (cause ? 0x80000ULL : 0);
        if (timestamps)
            timestamps[i] = 1700000000ULL + i;
    }
    *pageCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                              unsigned int *pageCount, unsigned long long *addresses)
{
    DEVICE_CALL(device);
    return retired_pages(&g, (unsigned int)handle_slot(device), cause, pageCount, addresses, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device,
                                                 nvmlPageRetirementCause_t cause,
                                                 unsigned int *pageCount,
                                                 unsigned long long *addresses,
                                                 unsigned long long *timestamps)
{
    DEVICE_CALL(device);
    return retired_pages(&g, (unsigned int)handle_slot(device), cause, pageCount, addresses,
                         timestamps);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                           nvmlEnableState_t *isPending)
{
    DEVICE_CALL(device);
    REQUIRE(isPending);
    *isPending = g.retired_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred)
{
    DEVICE_CALL(device);
    REQUIRE(corrRows && uncRows && isPending && failureOccurred);
    *corrRows = g.remap_corr;
    *uncRows = g.remap_unc;
    *isPending = g.remap_pending ? 1 : 0;
    *failureOccurred = g.remap_failure ? 1 : 0;
    return NVML_SUCCESS;
}

/* ---- links ----------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             nvmlEnableState_t *isActive)
{
    DEVICE_CALL(device);
    REQUIRE(isActive);
    if (link >= g.nvlinks || link >= MAX_LINKS)
        return g.nvlinks ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    *isActive = (g.nvlink_down >> link) & 1u ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

#define PCIE_GETTER(fname, field) \
    EXPORT nvmlReturn_t fname(nvmlDevice_t device, unsigned int *out) \
    { \
        DEVICE_CALL(device); \
        REQUIRE(out); \
        *out = g.field; \
        return NVML_SUCCESS; \
    }

PCIE_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
PCIE_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
PCIE_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)

/* ---- trend counters: PCIe replays, NVLink errors, clock violation time ---------------- */

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    DEVICE_CALL(device);
    REQUIRE(value);
    *value = g.pcie_replay;
    return NVML_SUCCESS;
}

/* The scenario keeps one count per GPU and counter; link 0 carries it, the others read 0. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                    nvmlNvLinkErrorCounter_t counter,
                                                    unsigned long long *counterValue)
{
    DEVICE_CALL(device);
    REQUIRE(counterValue);
    if (!g.nvlinks)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= g.nvlinks || link >= MAX_LINKS || (unsigned int)counter >= NVML_NVLINK_ERROR_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *counterValue = link == 0 ? g.nvlink_err[counter] : 0;
    return NVML_SUCCESS;
}

/* Power and thermal violation time; the other policies read 0. */
EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device,
                                                 nvmlPerfPolicyType_t perfPolicyType,
                                                 nvmlViolationTime_t *violTime)
{
    struct timespec now;
    DEVICE_CALL(device);
    REQUIRE(violTime);
    if ((unsigned int)perfPolicyType >= NVML_PERF_POLICY_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    clock_gettime(CLOCK_REALTIME, &now);
    violTime->referenceTime =
        (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000ULL;
    switch (perfPolicyType) {
    case NVML_PERF_POLICY_POWER: violTime->violationTime = g.violation_ns[0]; break;
    case NVML_PERF_POLICY_THERMAL: violTime->violationTime = g.violation_ns[1]; break;
    default: violTime->violationTime = 0; break;
    }
    return NVML_SUCCESS;
}

/* ---- processes --------------------------------------------------------------------------- */

static nvmlReturn_t processes(const gpu_state *g, unsigned int n, unsigned int *infoCount,
                              nvmlProcessInfo_t *infos)
{
    REQUIRE(infoCount);
    if (*infoCount < n || (n && !infos)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = g->proc_pid[i];
        infos[i].usedGpuMemory = g->proc_mib[i] * MIB;
        infos[i].gpuInstanceId = NO_INSTANCE;
        infos[i].computeInstanceId = NO_INSTANCE;
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    DEVICE_CALL(device);
    return processes(&g, g.nprocs, infoCount, infos);
}

/* A headless data-centre GPU: never any graphics processes. */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    DEVICE_CALL(device);
    return processes(&g, 0, infoCount, infos);
}

/* ---- field values ------------------------------------------------------------------------ */

/* A field's NVLink error total: what nvmlDeviceGetNvLinkErrorCounter gives summed over the
 * links (link 0 carries the GPU's count). */
static unsigned long long nvlink_total(const gpu_state *g, unsigned int fieldId)
{
    switch (fieldId) {
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
        return g->nvlink_err[NVML_NVLINK_ERROR_DL_CRC_FLIT];
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
        return g->nvlink_err[NVML_NVLINK_ERROR_DL_CRC_DATA];
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
        return g->nvlink_err[NVML_NVLINK_ERROR_DL_REPLAY];
    default:
        return g->nvlink_err[NVML_NVLINK_ERROR_DL_RECOVERY];
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values)
{
    struct timespec now;
    DEVICE_CALL(device);
    REQUIRE(values && valuesCount >= 0);
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        switch (v->fieldId) {
        case NVML_FI_DEV_ECC_CURRENT: v->value.ullVal = g.ecc_mode; break;
        case NVML_FI_DEV_ECC_SBE_VOL_TOTAL: v->value.ullVal = g.ecc[0][0]; break;
        case NVML_FI_DEV_ECC_DBE_VOL_TOTAL: v->value.ullVal = g.ecc[1][0]; break;
        case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: v->value.ullVal = g.ecc[0][1]; break;
        case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: v->value.ullVal = g.ecc[1][1]; break;
        case NVML_FI_DEV_RETIRED_SBE: v->value.ullVal = g.retired[0]; break;
        case NVML_FI_DEV_RETIRED_DBE: v->value.ullVal = g.retired[1]; break;
        case NVML_FI_DEV_RETIRED_PENDING: v->value.ullVal = g.retired_pending; break;
        case NVML_FI_DEV_REMAPPED_COR: v->value.ullVal = g.remap_corr; break;
        case NVML_FI_DEV_REMAPPED_UNC: v->value.ullVal = g.remap_unc; break;
        case NVML_FI_DEV_REMAPPED_PENDING: v->value.ullVal = g.remap_pending; break;
        case NVML_FI_DEV_REMAPPED_FAILURE: v->value.ullVal = g.remap_failure; break;
        case NVML_FI_DEV_PCIE_REPLAY_COUNTER: v->value.ullVal = g.pcie_replay; break;
        /* NVLink error totals over every link: the scenario's per-GPU counts (link 0's) */
        case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
        case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
            if (!g.nvlinks) {
                v->value.ullVal = 0;
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                break;
            }
            v->value.ullVal = nvlink_total(&g, v->fieldId);
            break;
        default:
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.ullVal = 0;
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* ---- events ------------------------------------------------------------------------------ */

#define SUPPORTED_EVENTS \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState | \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *eventTypes)
{
    DEVICE_CALL(device);
    REQUIRE(eventTypes);
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    SYSTEM_CALL();
    REQUIRE(set);
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    SYSTEM_CALL();
    REQUIRE(set);
    free(set);
    return NVML_SUCCESS;
}

static unsigned long long highest_seq_locked(unsigned int slot)
{
    unsigned long long seq = 0;
    for (unsigned int i = 0; i < g_sc->nevents; i++)
        if (g_sc->events[i].gpu == slot && g_sc->events[i].seq > seq)
            seq = g_sc->events[i].seq;
    return seq;
}

/* Only events injected after registration are delivered: the set remembers the highest
 * sequence number (and the volatile DBE count) present when the device was registered. */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set)
{
    unsigned int slot = (unsigned int)handle_slot(device);
    DEVICE_CALL(device);
    (void)g;
    REQUIRE(set);
    if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    if (!set->mask[slot]) {
        set->last_seq[slot] = highest_seq_locked(slot);
        set->last_dbe[slot] = g_sc->gpu[slot].ecc[1][0];
    }
    set->mask[slot] |= eventTypes;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

/* One pending event for the set, if any: the oldest new XID first, then a DBE rise. */
static int next_event_locked(nvmlEventSet_t set, nvmlEventData_t *data)
{
    const xid_event *best = NULL;
    for (unsigned int i = 0; i < g_sc->nevents; i++) {
        const xid_event *e = &g_sc->events[i];
        if (e->gpu < MAX_GPUS && (set->mask[e->gpu] & nvmlEventTypeXidCriticalError) &&
            e->seq > set->last_seq[e->gpu] && (!best || e->seq < best->seq))
            best = e;
    }
    memset(data, 0, sizeof *data);
    data->gpuInstanceId = data->computeInstanceId = NO_INSTANCE;
    if (best) {
        set->last_seq[best->gpu] = best->seq;
        data->device = &g_handles[best->gpu];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = best->xid;
        return 1;
    }
    for (unsigned int slot = 0; slot < g_sc->ngpus; slot++) {
        unsigned long long dbe = g_sc->gpu[slot].ecc[1][0];
        if (!(set->mask[slot] & nvmlEventTypeDoubleBitEccError))
            continue;
        if (dbe > set->last_dbe[slot]) {
            set->last_dbe[slot] = dbe;
            data->device = &g_handles[slot];
            data->eventType = nvmlEventTypeDoubleBitEccError;
            return 1;
        }
        set->last_dbe[slot] = dbe; /* a reset cleared the volatile count */
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms)
{
    struct timespec start;
    char err[256];
    double left;
    SYSTEM_CALL();
    REQUIRE(set && data);
    int watch = watch_scenario_dir();
    nvmlReturn_t rc;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&g_lock);
        if (g_refcount == 0) {
            pthread_mutex_unlock(&g_lock);
            rc = NVML_ERROR_UNINITIALIZED;
            break;
        }
        refresh_locked(err, sizeof err);
        if (next_event_locked(set, data)) {
            pthread_mutex_unlock(&g_lock);
            rc = NVML_SUCCESS;
            break;
        }
        pthread_mutex_unlock(&g_lock);
        left = timeoutms / 1000.0 - elapsed_s(&start);
        if (left <= 0) {
            rc = NVML_ERROR_TIMEOUT;
            break;
        }
        wait_for_change(watch, (long)(left * 1e9));
    }
    if (watch >= 0)
        close(watch);
    return rc;
}
