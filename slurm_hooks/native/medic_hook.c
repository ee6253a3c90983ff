/*
 * medic-hook: the compiled front of Medic's Prolog and Epilog (docs/operator-guide.md).
 *
 * A Python hook spends ~45 ms starting up and importing before it asks the daemon anything;
 * this answers the common case in about a millisecond and hands everything else to the
 * Python entry points, which hold all of Medic's policy:
 *
 *   Prolog (SLURM_SCRIPT_CONTEXT=prolog_slurmd, or anything but the Epilog's):
 *     note the start (CLOCK_MONOTONIC: the prolog's one deadline is this plus `[hooks]
 *     launch_budget`) and ask the local medic-healthd for a verdict from fresh results only
 *     ("fresh_only", with the job's partition and account as slurmd set them: an admin's
 *     [hooks] skip_launch_* list skips the launch checks), waiting at most
 *     QUESTION_TIMEOUT_MS; a reply saying "allow": true exits
 *     0. Everything else execs the Python prolog with MEDIC_LAUNCH_STARTED (the start, in
 *     seconds) and either MEDIC_LAUNCH_REPLY (the reply: a refusal it acts on, or the stale
 *     checks, which it asks the daemon to run within what is left of the budget) or
 *     MEDIC_LAUNCH_NOREPLY (why there was none: it judges inline with what is left).
 *
 *     Why the front knows no budget: it cannot read medic.toml (no TOML parser here, and none
 *     wanted), slurmd gives a prolog no environment of ours, and a file the daemon writes
 *     would be one more thing to go stale. A fresh-only question needs no budget: a working
 *     daemon answers it in about a millisecond, so a fixed wait no longer than the smallest
 *     budget allowed (0.5 s) is enough, and the Python prolog, which reads the one key,
 *     spends the budget from the front's start.
 *   Epilog (SLURM_SCRIPT_CONTEXT=epilog_slurmd):
 *     tell the daemon the job ended ({"op": "job_end"}) and exit 0, as the Python epilog does;
 *     when the job registered a node-local checkpoint tier on this node
 *     (<MEDIC_PROGRESS_DIR, else MEDIC_PROGRESS_DEFAULT>/<job>.<SLURMD_NODENAME>.local-tier),
 *     exec `medic-epilog --local-tier` instead, which starts the detached sweep that removes
 *     it once the job has ended for good (slurm_hooks.local_tier). When the reply says
 *     "hygiene": true ([hygiene] enabled), exec `medic-epilog --hygiene` instead, which
 *     cleans what the job left (slurm_hooks.hygiene_run) and then sees to the local tier.
 *
 * The socket is MEDIC_SOCKET, else the path compiled in (MEDIC_SOCKET_DEFAULT, the daemon's
 * default /run/medic/healthd.sock). Every socket call has a timeout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MEDIC_SOCKET_DEFAULT
#define MEDIC_SOCKET_DEFAULT "/run/medic/healthd.sock"
#endif
#ifndef MEDIC_PROGRESS_DEFAULT
#define MEDIC_PROGRESS_DEFAULT "/run/medic/progress"
#endif
#ifndef MEDIC_EPILOG
#error "build with -DMEDIC_EPILOG=\"/path/to/medic-epilog\" (python -m slurm_hooks.native.build)"
#endif
#ifndef MEDIC_PROLOG
#error "build with -DMEDIC_PROLOG=\"/path/to/medic-prolog\" (python -m slurm_hooks.native.build)"
#endif

/* The prolog's fresh-only question is answered in about a millisecond; past this the daemon
 * is hung or swamped and the Python prolog judges inline. Not above the smallest
 * `[hooks] launch_budget` (0.5 s). The Epilog's job_end is answered at once too. */
#define QUESTION_TIMEOUT_MS 500
#define REPLY_MAX 65536

static int digits_only(const char *s)
{
    if (!s || !*s || strlen(s) > 32)
        return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

/* SLURM_JOB_PARTITION or SLURM_JOB_ACCOUNT as the request carries it: 1-64 of letters,
 * digits, '_', '-' and '.' (nothing to escape in JSON), else "" (then no launch check is
 * skipped for it: [hooks] skip_launch_partitions and skip_launch_accounts). slurmd sets
 * both from the job's record; the job cannot name its own. */
static const char *job_word(const char *name)
{
    const char *s = getenv(name), *p;

    if (!s || !*s || strlen(s) > 64)
        return "";
    for (p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.'))
            return "";
    return s;
}

/* One request line, one reply line. Returns the reply length, or -1 (errno-style message in
 * `why`) when there is no reply to use. */
static int ask(const char *path, const char *request, char *reply, size_t cap, const char **why)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = QUESTION_TIMEOUT_MS / 1000,
                         .tv_usec = (QUESTION_TIMEOUT_MS % 1000) * 1000};
    size_t len = strlen(request), got = 0;
    int fd;

    if (strlen(path) >= sizeof addr.sun_path) {
        *why = "socket path too long";
        return -1;
    }
    strcpy(addr.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        write(fd, request, len) != (ssize_t)len) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    while (got < cap - 1) {
        ssize_t n = read(fd, reply + got, cap - 1 - got);
        if (n <= 0) {
            if (n == 0)
                *why = "the daemon closed the connection";
            else if (errno == EAGAIN || errno == EWOULDBLOCK)
                *why = "no answer to the front's question within its fixed wait";
            else
                *why = strerror(errno);
            close(fd);
            return -1;
        }
        got += (size_t)n;
        if (memchr(reply + got - n, '\n', (size_t)n))
            break;
    }
    close(fd);
    reply[got] = '\0';
    if (!strchr(reply, '\n')) {
        *why = "reply too long";
        return -1;
    }
    return (int)got;
}

/* A node-local checkpoint tier registered for this job here: hand over to the Python epilog,
 * which starts the sweep (and does not tell the daemon again). */
static void local_tier(const char *job)
{
    const char *dir = getenv("MEDIC_PROGRESS_DIR"), *node = getenv("SLURMD_NODENAME");
    char registration[4096];
    char *args[] = {(char *)MEDIC_EPILOG, (char *)"--local-tier", NULL};
    struct stat st;
    int n;

    if (!dir || !*dir)
        dir = MEDIC_PROGRESS_DEFAULT;
    if (!*job || !node || !*node || strchr(node, '/') || node[0] == '.')
        return;
    n = snprintf(registration, sizeof registration, "%s/%s.%s.local-tier", dir, job, node);
    if (n < 0 || n >= (int)sizeof registration || lstat(registration, &st) != 0)
        return;
    execv(MEDIC_EPILOG, args);
    fprintf(stderr, "medic-epilog: job %s: node-local checkpoints kept: cannot run %s: %s\n", job,
            MEDIC_EPILOG, strerror(errno));
}

/* `[hygiene] enabled` (the daemon's job_end reply says so): hand over to the Python epilog,
 * which cleans what the job left and then looks for a node-local tier itself. */
static void hygiene(const char *job)
{
    char *args[] = {(char *)MEDIC_EPILOG, (char *)"--hygiene", NULL};

    execv(MEDIC_EPILOG, args);
    fprintf(stderr, "medic-epilog: job %s: no hygiene: cannot run %s: %s\n", job, MEDIC_EPILOG,
            strerror(errno));
}

static int epilog(const char *path, const char *job)
{
    char request[128], reply[4096];
    const char *why = "";

    snprintf(request, sizeof request, "{\"op\": \"job_end\", \"job_id\": \"%s\"}\n", job);
    if (ask(path, request, reply, sizeof reply, &why) < 0)
        fprintf(stderr, "medic-epilog: job %s: no post-job checks: %s: %s\n", job, path, why);
    /* The daemon writes json.dumps(reply): the key and value exactly like this. */
    else if (*job && strstr(reply, "\"hygiene\": true"))
        hygiene(job);
    local_tier(job);
    return 0; /* Slurm's own "Epilog error" drain would only hide Medic's reason */
}

static int prolog(const char *path, const char *job, char **argv)
{
    static char reply[REPLY_MAX];
    char request[320], started[48];
    const char *why = "";
    struct timespec now;

    /* First: the launch budget counts from here. */
    if (clock_gettime(CLOCK_MONOTONIC, &now) == 0) {
        snprintf(started, sizeof started, "%lld.%09ld", (long long)now.tv_sec, now.tv_nsec);
        setenv("MEDIC_LAUNCH_STARTED", started, 1);
    }
    if (digits_only(job)) {
        snprintf(request, sizeof request,
                 "{\"op\": \"launch\", \"fresh_only\": true, \"job_id\": \"%s\", "
                 "\"partition\": \"%s\", \"account\": \"%s\"}\n",
                 job, job_word("SLURM_JOB_PARTITION"), job_word("SLURM_JOB_ACCOUNT"));
        if (ask(path, request, reply, sizeof reply, &why) >= 0) {
            /* The daemon writes json.dumps(reply): the key and value exactly like this. */
            if (strstr(reply, "\"allow\": true"))
                return 0;
            *strchr(reply, '\n') = '\0';
            setenv("MEDIC_LAUNCH_REPLY", reply, 1);
        } else {
            setenv("MEDIC_LAUNCH_NOREPLY", why, 1);
        }
    }
    argv[0] = (char *)MEDIC_PROLOG;
    execv(MEDIC_PROLOG, argv);
    /* Not even the Python prolog: say so and let the job run (a broken install must not
     * stop a whole cluster, as with a broken configuration). */
    fprintf(stderr, "medic-prolog: cannot run %s: %s (job %s allowed)\n", MEDIC_PROLOG,
            strerror(errno), job ? job : "");
    return 0;
}

int main(int argc, char **argv)
{
    const char *context = getenv("SLURM_SCRIPT_CONTEXT");
    const char *path = getenv("MEDIC_SOCKET");
    const char *job = getenv("SLURM_JOB_ID");

    (void)argc;
    if (!path || !*path)
        path = MEDIC_SOCKET_DEFAULT;
    if (context && !strcmp(context, "epilog_slurmd"))
        return epilog(path, digits_only(job) ? job : "");
    return prolog(path, job, argv);
}
