/* nri-numa-hook-client: the hook's fastest path, a compiled stand-in for
 * nri_numa/hook/fast_forward.py (docs/oci-hook.md, "The C client").
 *
 * A runtime runs it as it would run `nri-numa hook STAGE ...`. When nri-numa hook-daemon
 * listens on <state-dir>/hook.sock, it sends the run there as one JSON line and relays the
 * answer: byte for byte the request fast_forward.py sends, the same reply reading, exit status
 * and one-line messages, and --timeout counted from the start of this process. In every case
 * it does not handle (arguments argparse must judge, no daemon, a socket nobody accepts on,
 * --start-daemon's starting) it execs `PYTHON -I -S FAST_CLIENT ARGS` in this same process
 * before reading anything from stdin: the Python fast client, which finds no daemon either and
 * runs the full hook in its own process, as the shipped Python hooks do; its deadline still
 * counts from this process's start. PYTHON, the interpreter nri-numa is installed in, and
 * FAST_CLIENT, that installation's nri_numa/hook/fast_client.py, are fixed when this file is
 * compiled (python -m nri_numa.hook.c_client).
 *
 * Why C: a Python client pays the interpreter's start (15-18 ms on a small VM) before its first
 * line runs; this costs about a millisecond. Plain C99 with POSIX and Linux's /proc; no library.
 * Every wait is a poll() against the deadline, so no signal handler is needed and nothing can
 * block past --timeout.
 */
#define _GNU_SOURCE /* CLOCK_BOOTTIME, MSG_NOSIGNAL, SOCK_CLOEXEC */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#if !defined NRI_NUMA_PYTHON || !defined NRI_NUMA_FAST_CLIENT
#error "build with python -m nri_numa.hook.c_client (it defines NRI_NUMA_PYTHON and NRI_NUMA_FAST_CLIENT)"
#endif

/* The constants of fast_forward.py, which a test holds to these. */
#define SOCKET_NAME "hook.sock"
#define LOG_NAME "hook.log"
#define DEFAULT_STATE_DIR "/run/nri-numa"
#define DEFAULT_TIMEOUT_S 4.0
#define MAX_TIMEOUT_S 86400.0
#define MAX_LINE (64L << 20) /* the daemon drops a longer request */
#define COUNTED "(--timeout, counted from the start of the hook process)"
#define DAEMON_HINT "the hook daemon had more runs queued than it could serve in that time " \
                    "(docs/oci-hook.md, \"Burst-proof setup\")"
#define START_TIME_FIELD 22 /* /proc/PID/stat, 1-based; clock ticks after boot */
#define CHUNK 65536

static const char *const STAGES[] = {"createRuntime", "prestart", "poststop", "precreate"};
/* The options with a value, as the daemon's request keys (nri_numa.hook.client.VALUE_OPTIONS). */
static const char *const VALUE_OPTIONS[][2] = {
    {"--state-dir", "state_dir"}, {"--config", "config"}, {"--topology", "topology"},
    {"--log-file", "log_file"}, {"--timeout", "timeout"}, {"--cgroup-root", "cgroup_root"},
    {"--proc-root", "proc_root"}};
#define N_OPTIONS (sizeof VALUE_OPTIONS / sizeof VALUE_OPTIONS[0])

/* One run: what the give-up line and the log need. */
static const char *stage;
static double timeout_s;
static double started;        /* CLOCK_MONOTONIC seconds at the process's start */
static const char *phase = "starting up (Python and nri-numa)";
static const char *hint = "";
static char log_path[8192];

/* ---- time ---------------------------------------------------------------------------- */

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* When this process was created (exec keeps it), as a CLOCK_MONOTONIC value: a runtime's hook
 * timer starts with the process, not with our first line. Now when /proc cannot tell. */
static double process_started(void) {
    double now = clock_s(CLOCK_MONOTONIC);
    char text[4096];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return now;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return now;
    text[n] = 0;
    char *p = strrchr(text, ')'); /* the command name may hold spaces and ')' */
    if (!p)
        return now;
    p++;
    for (int field = 3; field < START_TIME_FIELD; field++) {
        while (*p == ' ')
            p++;
        while (*p && *p != ' ')
            p++;
    }
    char *end;
    errno = 0;
    unsigned long long ticks = strtoull(p, &end, 10);
    long hz = sysconf(_SC_CLK_TCK);
    if (end == p || errno || hz <= 0)
        return now;
    double age = clock_s(CLOCK_BOOTTIME) - (double)ticks / (double)hz;
    return now - (age > 0 ? age : 0.0);
}

static double left(void) { return timeout_s - (clock_s(CLOCK_MONOTONIC) - started); }

/* ---- text as Python writes it ---------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s (Unicode table 3-7, as Python's decoder
 * checks it), or 0 for a byte that does not start one: Python's surrogateescape turns each
 * such byte into U+DC80..U+DCFF. *cp gets the code point. */
static size_t utf8_char(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        *cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        *cp = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F; /* no UTF-8-encoded surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        *cp = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        unsigned b = s[i];
        if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF))
            return 0;
        *cp = (*cp << 6) | (b & 0x3F);
    }
    return len;
}

/* A growing byte buffer; out of memory ends the process with one line. */
struct buf {
    char *data;
    size_t len, cap;
};

static void die(const char *fmt, ...);
static int failing; /* the failure line is being written: no second failure */

static void put(struct buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown && failing)
            _exit(1); /* no memory left even for the failure line */
        if (!grown)
            die("out of memory");
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* Bytes that came from argv (Python decodes them with surrogateescape) as Python writes them:
 * to stderr with backslashreplace (an undecodable byte 0xff as \udcff), to the log with
 * encode("utf-8", "replace") ("?"). */
static void put_text(struct buf *b, const char *s, int for_log) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = utf8_char(u + i, n - i, &cp);
        if (len) {
            put(b, s + i, len);
            i += len;
        } else {
            char esc[8];
            snprintf(esc, sizeof esc, "\\udc%02x", u[i]);
            puts_(b, for_log ? "?" : esc);
            i++;
        }
    }
}

static void write_all(int fd, const char *s, size_t n);

/* ---- the hook log and the one-line failures ------------------------------------------- */

/* The folder `path`, made (0700, with its parents) when missing, as fast_forward._open_folder. */
static int open_folder(const char *path) {
    int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, flags);
    if (fd >= 0 || errno != ENOENT)
        return fd;
    char parent[sizeof log_path];
    snprintf(parent, sizeof parent, "%s", path);
    size_t n = strlen(parent);
    while (n && parent[n - 1] == '/')
        parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) { /* a parent other than "/" or "." may be missing too */
        *slash = 0;
        int up = open_folder(parent);
        if (up < 0)
            return -1;
        close(up);
    }
    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return -1;
    return open(path, flags);
}

/* One line appended to the hook log, as nri_numa.hook.deadline.log_line writes it: never
 * through a symlink, never waiting on a FIFO; a log that cannot be written is skipped. */
static void log_line(const char *line) {
    double now = clock_s(CLOCK_REALTIME);
    time_t secs = (time_t)now;
    struct tm tm;
    char stamp[64];
    localtime_r(&secs, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    struct buf text = {0};
    char head[160];
    snprintf(head, sizeof head, "%s,%03d ERROR hook[%ld] %s: ", stamp,
             (int)((now - (double)(long long)now) * 1000), (long)getpid(), stage);
    puts_(&text, head);
    put_text(&text, line, 1);
    puts_(&text, "\n");

    char folder_path[sizeof log_path];
    snprintf(folder_path, sizeof folder_path, "%s", log_path);
    char *slash = strrchr(folder_path, '/');
    const char *name = log_path;
    if (slash) {
        name = log_path + (slash - folder_path) + 1;
        if (slash == folder_path)
            slash[1] = 0; /* "/name": the folder is "/" */
        else
            *slash = 0;
    } else {
        strcpy(folder_path, ".");
    }
    int folder = open_folder(folder_path);
    if (folder >= 0) {
        int fd = openat(folder, name, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC |
                        O_NONBLOCK, 0600);
        close(folder);
        struct stat st;
        if (fd >= 0) {
            if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
                (void)!write(fd, text.data, text.len);
            close(fd);
        }
    }
    free(text.data);
}

/* The hook fails closed: one line on stderr and in the log (crun drops a hook's stderr),
 * exit status 1. */
static void fail(const char *reason) {
    failing = 1;
    struct buf line = {0};
    puts_(&line, "nri-numa hook ");
    puts_(&line, stage);
    puts_(&line, ": ");
    put_text(&line, reason, 0);
    puts_(&line, "\n");
    write_all(2, line.data, line.len);
    char ms[32];
    snprintf(ms, sizeof ms, " (%.0f ms)", (clock_s(CLOCK_MONOTONIC) - started) * 1000);
    struct buf logged = {0};
    puts_(&logged, reason);
    puts_(&logged, ms);
    log_line(logged.data);
    exit(1);
}

static void die(const char *fmt, ...) {
    char reason[sizeof log_path + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    fail(reason);
}

/* --timeout has passed: the line fast_forward's timer writes, naming what this run was doing. */
static void give_up(void) {
    char line[1024];
    snprintf(line, sizeof line, "gave up after %g s " COUNTED " while %s%s%s", timeout_s, phase,
             *hint ? ": " : "", hint);
    fail(line);
}

/* Wait until fd is ready for `events` or the deadline passes (then give up; while the failure
 * line itself is written, 0 after a short grace instead). */
static int wait_for(int fd, short events) {
    double grace_end = clock_s(CLOCK_MONOTONIC) + 0.1;
    for (;;) {
        double remaining = failing ? grace_end - clock_s(CLOCK_MONOTONIC) : left();
        if (remaining <= 0 && failing)
            return 0;
        if (remaining <= 0)
            give_up();
        struct pollfd p = {fd, events, 0};
        int ms = (int)(remaining * 1000) + 1;
        int got = poll(&p, 1, ms);
        if (got > 0)
            return 1; /* ready, hung up or invalid: the read or write that follows says which */
        if (got < 0 && errno != EINTR)
            return 1;
    }
}

/* Output to the runtime's pipe, at most PIPE_BUF at a time after poll says there is room, so
 * that a runtime that stops reading cannot hold this process past its deadline. */
static void write_all(int fd, const char *s, size_t n) {
    while (n) {
        if (!wait_for(fd, POLLOUT))
            return;
        ssize_t done = write(fd, s, n < 4096 ? n : 4096);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return; /* a closed stdout or stderr: nothing more can be said there */
        s += done;
        n -= (size_t)done;
    }
}

/* ---- the full hook -------------------------------------------------------------------- */

/* Become `PYTHON -I -S FAST_CLIENT ARGS` with stdin untouched, as the Python hooks run it (-I:
 * never import from the bundle, the hook's cwd, nor read PYTHON* variables; -S: no site). */
static int run_full_hook(int argc, char **argv) {
    char **full = calloc((size_t)argc + 5, sizeof *full);
    if (!full) {
        fprintf(stderr, "nri-numa hook: out of memory\n");
        return 1;
    }
    full[0] = NRI_NUMA_PYTHON;
    full[1] = "-I";
    full[2] = "-S";
    full[3] = NRI_NUMA_FAST_CLIENT;
    for (int i = 1; i < argc; i++)
        full[3 + i] = argv[i];
    execv(NRI_NUMA_PYTHON, full);
    fprintf(stderr, "nri-numa hook: cannot run %s: %s\n", NRI_NUMA_PYTHON, strerror(errno));
    return 1;
}

/* ---- arguments ------------------------------------------------------------------------ */

struct option {
    const char *key, *value;
};
static struct option options[N_OPTIONS];
static size_t n_options;

static const char *option(const char *key) {
    for (size_t i = 0; i < n_options; i++)
        if (!strcmp(options[i].key, key))
            return options[i].value;
    return NULL;
}

/* A value set again keeps its first place, as in the Python client's dict. */
static void set_option(const char *key, const char *value) {
    for (size_t i = 0; i < n_options; i++)
        if (!strcmp(options[i].key, key)) {
            options[i].value = value;
            return;
        }
    options[n_options].key = key;
    options[n_options++].value = value;
}

/* The rules of fast_forward.parse_args; 0 for anything argparse must judge. */
static int parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (!strcmp(arg, "--start-daemon"))
            continue; /* it matters only when no daemon listens: then the full hook starts one */
        const char *key = NULL;
        for (size_t k = 0; k < N_OPTIONS && !key; k++)
            if (strlen(VALUE_OPTIONS[k][0]) == name_len && !strncmp(arg, VALUE_OPTIONS[k][0],
                                                                     name_len))
                key = VALUE_OPTIONS[k][1];
        if (key) {
            if (eq)
                set_option(key, eq + 1);
            else if (i + 1 < argc)
                set_option(key, argv[++i]);
            else
                return 0;
            continue;
        }
        int is_stage = 0;
        for (size_t s = 0; s < sizeof STAGES / sizeof STAGES[0]; s++)
            is_stage |= !strcmp(arg, STAGES[s]);
        if (is_stage && !stage)
            stage = arg;
        else
            return 0;
    }
    return stage != NULL;
}

/* --timeout in seconds, 0 when this client leaves it to Python. Only the plain decimal forms
 * are read here, where strtod and Python's float() agree; anything else Python may still
 * accept (" 8", "1_0") goes to the full hook, which judges it as the Python client would. */
static double hook_timeout(void) {
    const char *text = option("timeout");
    if (!text)
        return DEFAULT_TIMEOUT_S;
    const char *p = text;
    int digits = 0;
    if (*p == '+' || *p == '-')
        p++;
    for (; *p >= '0' && *p <= '9'; p++)
        digits++;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            digits++;
    if (!digits)
        return 0;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p)
        return 0;
    double timeout = strtod(text, NULL);
    return timeout > 0 && timeout <= MAX_TIMEOUT_S ? timeout : 0;
}

/* ---- the request ---------------------------------------------------------------------- */

/* The request goes out as it is encoded, 64 KiB at a time: the bytes on the socket are those
 * fast_forward builds in one piece, without holding six times the stdin in memory. */
static int conn = -1;
static char send_buf[CHUNK];
static size_t send_len;
static char socket_path[sizeof log_path];

static void fail_daemon(const char *what) {
    die("the hook daemon at %s failed before answering: %s", socket_path, what);
}

static void fail_errno(void) {
    char what[256];
    snprintf(what, sizeof what, "[Errno %d] %s", errno, strerror(errno));
    fail_daemon(what);
}

static void flush_request(void) {
    size_t done = 0;
    while (done < send_len) {
        wait_for(conn, POLLOUT);
        ssize_t n = send(conn, send_buf + done, send_len - done, MSG_NOSIGNAL);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            fail_errno();
        done += (size_t)n;
    }
    send_len = 0;
}

static void emit(const char *s, size_t n) {
    while (n) {
        size_t room = sizeof send_buf - send_len;
        size_t take = n < room ? n : room;
        memcpy(send_buf + send_len, s, take);
        send_len += take;
        s += take;
        n -= take;
        if (send_len == sizeof send_buf)
            flush_request();
    }
}

static void emit_s(const char *s) { emit(s, strlen(s)); }

static void emit_u(unsigned unit) {
    char esc[8];
    snprintf(esc, sizeof esc, "\\u%04x", unit & 0xFFFF);
    emit(esc, 6);
}

/* A JSON string as _json.encode_basestring_ascii writes the text Python decodes from these
 * bytes with surrogateescape: printable ASCII as is, the short escapes, everything else
 * \uXXXX in lower-case hex (astral code points as surrogate pairs, an undecodable byte B as
 * \udcBB). */
static void emit_json_string(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    emit("\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = utf8_char(u + i, n - i, &cp);
        if (!len) {
            emit_u(0xDC00 | u[i]);
            i++;
            continue;
        }
        i += len;
        if (cp == '"')
            emit("\\\"", 2);
        else if (cp == '\\')
            emit("\\\\", 2);
        else if (cp == '\n')
            emit("\\n", 2);
        else if (cp == '\r')
            emit("\\r", 2);
        else if (cp == '\t')
            emit("\\t", 2);
        else if (cp == '\b')
            emit("\\b", 2);
        else if (cp == '\f')
            emit("\\f", 2);
        else if (cp >= 0x20 && cp <= 0x7E) {
            char c = (char)cp;
            emit(&c, 1);
        } else if (cp > 0xFFFF) {
            cp -= 0x10000;
            emit_u(0xD800 | (cp >> 10));
            emit_u(0xDC00 | (cp & 0x3FF));
        } else {
            emit_u(cp);
        }
    }
    emit("\"", 1);
}

/* A float as Python's repr writes it: the fewest digits that read back as the same double,
 * positional from 1e-4 up to below 1e16, else with an exponent of at least two digits. */
static void float_repr(double value, char *out, size_t size) {
    static const char zeros[] = "0000000000000000";
    char sci[40], mantissa[24];
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(sci, sizeof sci, "%.*e", digits - 1, value);
        if (strtod(sci, NULL) == value)
            break;
    }
    const char *p = sci, *sign = "";
    if (*p == '-')
        sign = "-", p++;
    int n = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            mantissa[n++] = *p;
    while (n > 1 && mantissa[n - 1] == '0')
        n--;
    mantissa[n] = 0;
    int point = atoi(p + 1) + 1; /* value = 0.MANTISSA x 10^point */
    if (point <= -4 || point > 16)
        snprintf(out, size, "%s%c%s%s%se%c%02d", sign, mantissa[0], n > 1 ? "." : "",
                 mantissa + 1, "", point - 1 < 0 ? '-' : '+', abs(point - 1));
    else if (point <= 0)
        snprintf(out, size, "%s0.%.*s%s", sign, -point, zeros, mantissa);
    else if (point >= n)
        snprintf(out, size, "%s%s%.*s.0", sign, mantissa, point - n, zeros);
    else
        snprintf(out, size, "%s%.*s.%s", sign, point, mantissa, mantissa + point);
}

/* stdin, all of it, up to MAX_LINE bytes: the OCI state or podman's spec. */
static struct buf read_stdin(void) {
    struct buf in = {0};
    char chunk[CHUNK];
    for (;;) {
        wait_for(0, POLLIN);
        ssize_t n = read(0, chunk, sizeof chunk);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            fail_errno();
        if (n == 0)
            return in;
        put(&in, chunk, (size_t)n);
        if (in.len > (size_t)MAX_LINE) {
            char what[128];
            snprintf(what, sizeof what, "more than %ld bytes on stdin, which is no OCI state",
                     MAX_LINE);
            fail_daemon(what);
        }
    }
}

/* ---- the reply ------------------------------------------------------------------------ */

/* The reply's form, as json.loads reads it: an object whose "exit" is an integer and
 * "stdout" and "stderr" strings (other members are read and ignored). A JSON string is
 * written out as Python writes that text: UTF-8; a lone surrogate on stdout as the byte it
 * escapes (surrogateescape, U+DC80..U+DCFF) and otherwise, as on stderr, \udXXX
 * (backslashreplace; Python's stdout would raise there). */
struct reader {
    const unsigned char *p, *end;
    int bad; /* not JSON */
};

static void skip_ws(struct reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int hex4(struct reader *r, unsigned *unit) {
    *unit = 0;
    for (int i = 0; i < 4; i++, r->p++) {
        if (r->p >= r->end)
            return 0;
        unsigned c = *r->p;
        unsigned v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                     : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 16;
        if (v == 16)
            return 0;
        *unit = *unit << 4 | v;
    }
    return 1;
}

static void put_code_point(struct buf *out, unsigned cp, int for_stdout) {
    char bytes[8];
    if (cp >= 0xD800 && cp <= 0xDFFF) {
        if (for_stdout && cp >= 0xDC80 && cp <= 0xDCFF) {
            bytes[0] = (char)(cp & 0xFF);
            put(out, bytes, 1);
        } else {
            snprintf(bytes, sizeof bytes, "\\u%04x", cp & 0xFFFF);
            put(out, bytes, 6);
        }
        return;
    }
    size_t n;
    if (cp < 0x80)
        bytes[0] = (char)cp, n = 1;
    else if (cp < 0x800)
        bytes[0] = (char)(0xC0 | cp >> 6), bytes[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        bytes[0] = (char)(0xE0 | cp >> 12), bytes[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
        bytes[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        bytes[0] = (char)(0xF0 | cp >> 18), bytes[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
        bytes[2] = (char)(0x80 | (cp >> 6 & 0x3F)), bytes[3] = (char)(0x80 | (cp & 0x3F)),
        n = 4;
    put(out, bytes, n);
}

/* A JSON string after its opening quote, into `out` (NULL: only checked). */
static void json_string(struct reader *r, struct buf *out, int for_stdout) {
    struct buf scratch = {0};
    if (!out)
        out = &scratch;
    for (;;) {
        if (r->p >= r->end) {
            r->bad = 1;
            break;
        }
        unsigned c = *r->p;
        if (c == '"') {
            r->p++;
            break;
        }
        if (c < 0x20) { /* json.loads is strict: no raw control characters */
            r->bad = 1;
            break;
        }
        if (c != '\\') {
            unsigned cp;
            size_t len = utf8_char(r->p, (size_t)(r->end - r->p), &cp);
            if (!len) { /* the line is not UTF-8: json cannot read it */
                r->bad = 1;
                break;
            }
            put(out, (const char *)r->p, len);
            r->p += len;
            continue;
        }
        r->p++;
        if (r->p >= r->end) {
            r->bad = 1;
            break;
        }
        c = *r->p++;
        const char *simple = c == '"' ? "\"" : c == '\\' ? "\\" : c == '/' ? "/" : c == 'b'
                             ? "\b" : c == 'f' ? "\f" : c == 'n' ? "\n" : c == 'r' ? "\r"
                             : c == 't' ? "\t" : NULL;
        if (simple) {
            put(out, simple, 1);
            continue;
        }
        unsigned unit, low;
        if (c != 'u' || !hex4(r, &unit)) {
            r->bad = 1;
            break;
        }
        /* A high surrogate followed by an escaped low one is one code point, as json reads. */
        if (unit >= 0xD800 && unit <= 0xDBFF && r->end - r->p >= 6 && r->p[0] == '\\' &&
            r->p[1] == 'u') {
            struct reader ahead = {r->p + 2, r->end, 0};
            if (hex4(&ahead, &low) && low >= 0xDC00 && low <= 0xDFFF) {
                unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                r->p = ahead.p;
            }
        }
        put_code_point(out, unit, for_stdout);
    }
    free(scratch.data);
}

/* A JSON number; *is_int when it has no fraction or exponent, *low8 its value modulo 256
 * (the exit status the Python client's sys.exit gives for it). */
static void json_number(struct reader *r, int *is_int, int *low8) {
    int negative = 0, value = 0;
    *is_int = 1;
    if (r->p < r->end && *r->p == '-')
        negative = 1, r->p++;
    if (r->end - r->p >= 8 && !memcmp(r->p, "Infinity", 8)) { /* json.loads takes it */
        r->p += 8;
        *is_int = 0;
        return;
    }
    const unsigned char *first = r->p;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9')
        value = (value * 10 + (*r->p++ - '0')) & 0xFF;
    if (r->p == first || (*first == '0' && r->p - first > 1)) {
        r->bad = 1;
        return;
    }
    if (r->p < r->end && *r->p == '.') {
        *is_int = 0;
        first = ++r->p;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9')
            r->p++;
        if (r->p == first)
            r->bad = 1;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        *is_int = 0;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-'))
            r->p++;
        first = r->p;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9')
            r->p++;
        if (r->p == first)
            r->bad = 1;
    }
    *low8 = negative ? (256 - value) & 0xFF : value;
}

/* Any JSON value, checked and skipped; nesting is bounded (Python's would stop at its
 * recursion limit). */
static void json_skip(struct reader *r, int depth) {
    skip_ws(r);
    if (r->p >= r->end || depth > 64) {
        r->bad = 1;
        return;
    }
    static const char *const words[] = {"true", "false", "null", "NaN"};
    for (size_t w = 0; w < 4; w++) {
        size_t n = strlen(words[w]);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[w], n)) {
            r->p += n;
            return;
        }
    }
    unsigned char open = *r->p;
    if (open == '"') {
        r->p++;
        json_string(r, NULL, 0);
    } else if (open == '[' || open == '{') {
        unsigned char close = open == '[' ? ']' : '}';
        r->p++;
        skip_ws(r);
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return;
        }
        while (!r->bad) {
            if (open == '{') {
                skip_ws(r);
                if (r->p >= r->end || *r->p != '"') {
                    r->bad = 1;
                    return;
                }
                r->p++;
                json_string(r, NULL, 0);
                skip_ws(r);
                if (r->p >= r->end || *r->p++ != ':') {
                    r->bad = 1;
                    return;
                }
            }
            json_skip(r, depth + 1);
            skip_ws(r);
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                continue;
            }
            if (r->p < r->end && *r->p == close) {
                r->p++;
                return;
            }
            r->bad = 1;
        }
    } else {
        int is_int, low8;
        json_number(r, &is_int, &low8);
    }
}

/* (exit, stdout, stderr) from the daemon's line, or the Python client's words for why not. */
static const char *decode_reply(const char *line, size_t n, int *code, struct buf *out,
                                struct buf *err) {
    struct reader r = {(const unsigned char *)line, (const unsigned char *)line + n, 0};
    int have_code = 0, have_out = 0, have_err = 0;
    skip_ws(&r);
    if (r.p < r.end && *r.p != '{') {
        json_skip(&r, 0);
        skip_ws(&r);
        return r.bad || r.p != r.end ? "the hook daemon's answer is not JSON"
                                     : "the hook daemon's answer is not a JSON object";
    }
    if (r.p >= r.end)
        return "the hook daemon's answer is not JSON";
    r.p++;
    skip_ws(&r);
    if (r.p < r.end && *r.p == '}')
        r.p++;
    else
        while (!r.bad) {
            skip_ws(&r);
            if (r.p >= r.end || *r.p++ != '"') {
                r.bad = 1;
                break;
            }
            struct buf key = {0};
            json_string(&r, &key, 0);
            skip_ws(&r);
            if (r.bad || r.p >= r.end || *r.p++ != ':') {
                free(key.data);
                r.bad = 1;
                break;
            }
            skip_ws(&r);
            const char *name = key.data ? key.data : "";
            int is_exit = key.len == 4 && !memcmp(name, "exit", 4);
            int is_out = key.len == 6 && !memcmp(name, "stdout", 6);
            int is_err = key.len == 6 && !memcmp(name, "stderr", 6);
            free(key.data);
            /* Each member counts as its last value, as in a dict. */
            if ((is_out || is_err) && r.p < r.end && *r.p == '"') {
                struct buf *into = is_out ? out : err;
                into->len = 0;
                r.p++;
                json_string(&r, into, is_out);
                *(is_out ? &have_out : &have_err) = 1;
            } else if (is_exit && r.p < r.end && (*r.p == '-' || (*r.p >= '0' && *r.p <= '9'))) {
                int is_int;
                json_number(&r, &is_int, code);
                have_code = is_int;
            } else {
                if (is_exit)
                    have_code = 0;
                if (is_out)
                    have_out = 0;
                if (is_err)
                    have_err = 0;
                json_skip(&r, 1);
            }
            skip_ws(&r);
            if (r.p < r.end && *r.p == ',') {
                r.p++;
                continue;
            }
            if (r.p < r.end && *r.p == '}') {
                r.p++;
                break;
            }
            r.bad = 1;
        }
    skip_ws(&r);
    if (r.bad || r.p != r.end)
        return "the hook daemon's answer is not JSON";
    if (!have_code || !have_out || !have_err)
        return "the hook daemon's answer lacks exit, stdout or stderr";
    return NULL;
}

/* One newline-terminated line from the daemon. */
static struct buf read_line(void) {
    struct buf line = {0};
    char chunk[CHUNK];
    for (;;) {
        wait_for(conn, POLLIN);
        ssize_t n = recv(conn, chunk, sizeof chunk, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            fail_errno();
        if (n == 0)
            fail_daemon("the connection closed before a whole line came");
        char *end = memchr(chunk, '\n', (size_t)n);
        if (end) {
            put(&line, chunk, (size_t)(end - chunk));
            return line;
        }
        put(&line, chunk, (size_t)n);
        if (line.len > (size_t)MAX_LINE) {
            char what[64];
            snprintf(what, sizeof what, "a line longer than %ld bytes", MAX_LINE);
            fail_daemon(what);
        }
    }
}

/* ---- one run -------------------------------------------------------------------------- */

static void join(char *out, size_t size, const char *folder, const char *name) {
    size_t n = strlen(folder);
    snprintf(out, size, "%s%s%s", folder, n && folder[n - 1] != '/' ? "/" : "", name);
}

int main(int argc, char **argv) {
    if (!parse_args(argc, argv))
        return run_full_hook(argc, argv);
    timeout_s = hook_timeout();
    if (timeout_s == 0)
        return run_full_hook(argc, argv);
    started = process_started();
    const char *state_dir = option("state_dir") ? option("state_dir") : DEFAULT_STATE_DIR;
    const char *log_file = option("log_file");
    if (strlen(state_dir) + sizeof LOG_NAME + 1 >= sizeof log_path ||
        (log_file && strlen(log_file) >= sizeof log_path))
        return run_full_hook(argc, argv); /* past PATH_MAX: the full hook words the error */
    if (log_file && *log_file)
        snprintf(log_path, sizeof log_path, "%s", log_file);
    else
        join(log_path, sizeof log_path, state_dir, LOG_NAME);

    phase = "looking for the hook daemon";
    join(socket_path, sizeof socket_path, state_dir, SOCKET_NAME);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof addr.sun_path)
        die("cannot reach the hook daemon at %s: AF_UNIX path too long", socket_path);
    memcpy(addr.sun_path, socket_path, strlen(socket_path) + 1);
    conn = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (conn >= 0 && conn <= 2) {
        /* A runtime that closed stdin (or stdout, stderr) must not have the socket read or
         * written as that: a closed stdin then reads as one, EBADF. */
        int moved = fcntl(conn, F_DUPFD_CLOEXEC, 3);
        close(conn);
        conn = moved;
    }
    if (conn < 0)
        die("cannot reach the hook daemon at %s: [Errno %d] %s", socket_path, errno,
            strerror(errno));
    if (connect(conn, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno == ENOENT || errno == ECONNREFUSED) { /* no daemon: the full hook decides */
            close(conn);
            return run_full_hook(argc, argv);
        }
        die("cannot reach the hook daemon at %s: [Errno %d] %s", socket_path, errno,
            strerror(errno));
    }
    /* The daemon counts the time spent before it took the request from here. */
    double now = clock_s(CLOCK_MONOTONIC);
    double started_wall = clock_s(CLOCK_REALTIME) - (now - started);

    phase = "reading the OCI state on stdin";
    struct buf in = read_stdin();

    phase = "waiting for the hook daemon's answer";
    hint = DAEMON_HINT;
    emit_s("{\"stage\": ");
    emit_json_string(stage, strlen(stage));
    emit_s(", \"stdin\": ");
    emit_json_string(in.data ? in.data : "", in.len);
    emit_s(", \"options\": {");
    for (size_t i = 0; i < n_options; i++) {
        emit_json_string(options[i].key, strlen(options[i].key));
        emit_s(": ");
        emit_json_string(options[i].value, strlen(options[i].value));
        emit_s(", ");
    }
    char when[64];
    float_repr(started_wall, when, sizeof when);
    emit_s("\"started\": ");
    emit_s(when);
    emit_s("}}\n");
    flush_request();
    free(in.data);

    struct buf line = read_line();
    struct buf out = {0}, err = {0};
    int code = 0;
    const char *bad = decode_reply(line.data ? line.data : "", line.len, &code, &out, &err);
    if (bad)
        fail_daemon(bad);
    close(conn);
    signal(SIGPIPE, SIG_IGN); /* a runtime that closed our stdout gets no more; no death */
    write_all(1, out.data ? out.data : "", out.len);
    write_all(2, err.data ? err.data : "", err.len);
    return code;
}
