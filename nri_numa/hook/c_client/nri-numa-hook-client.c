/* nri-numa-hook-client: the hook's thin client, compiled (docs/oci-hook.md, "The C client").
 *
 * It does what nri_numa/hook/client.py does, whose docstring holds the contract: connect to
 * $NRI_NUMA_HOOK_SOCKET (default DEFAULT_SOCKET), send the arguments after argv[0], each ended
 * by a NUL byte, with descriptors 0, 1 and 2 attached (SCM_RIGHTS), shut down writing, read one
 * byte and exit with it. The daemon parses the arguments, reads stdin, writes stdout and stderr
 * and keeps the deadline; this reads no option and keeps no timer. With no daemon there, no
 * arguments, or a standard descriptor closed, it execs `PYTHON -I -m nri_numa hook ARGS`.
 *
 * PYTHON (nri-numa's interpreter), DEFAULT_SOCKET and SOCKET_ENV are fixed when this file is
 * compiled, from nri_numa.hook.client (python -m nri_numa.hook.c_client).
 */
#define _GNU_SOURCE /* MSG_NOSIGNAL, SOCK_CLOEXEC */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#if !defined PYTHON || !defined DEFAULT_SOCKET || !defined SOCKET_ENV
#error "build with python -m nri_numa.hook.c_client (it defines PYTHON, DEFAULT_SOCKET, SOCKET_ENV)"
#endif

#define UNREACHABLE "cannot reach the hook daemon at"

/* Become `PYTHON -I -m nri_numa hook ARGS`, this process's pid and start time kept. */
static void run_in_python(int argc, char **argv) {
    size_t given = argc > 1 ? (size_t)argc - 1 : 0; /* an exec may pass no argv[0] at all */
    char **args = calloc(given + 6, sizeof *args);
    if (args) {
        args[0] = PYTHON;
        args[1] = "-I";
        args[2] = "-m";
        args[3] = "nri_numa";
        args[4] = "hook";
        memcpy(args + 5, argv + 1, given * sizeof *args);
        execv(PYTHON, args);
    }
    fprintf(stderr, "nri-numa hook: cannot run %s: %s\n", PYTHON, strerror(errno));
    exit(1);
}

/* One line, as nri_numa.hook.client words it: "nri-numa hook: HEAD PATHTAIL[: strerror]". */
static int fail(const char *head, const char *path, const char *tail, int err) {
    fprintf(stderr, "nri-numa hook: %s %s%s%s%s\n", head, path, tail, err ? ": " : "",
            err ? strerror(err) : "");
    return 1;
}

/* Send all of data[0..size), the descriptors with the first byte; 0, or -1 with errno. */
static int send_all(int sock, const char *data, size_t size, const int fds[3]) {
    char control[CMSG_SPACE(3 * sizeof(int))];
    memset(control, 0, sizeof control);
    struct iovec iov = {(void *)data, size};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(3 * sizeof(int));
    memcpy(CMSG_DATA(cmsg), fds, 3 * sizeof(int));
    while (size > 0) {
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        data += n;
        size -= (size_t)n;
        iov.iov_base = (void *)data;
        iov.iov_len = size;
        msg.msg_control = NULL; /* sent with the first bytes */
        msg.msg_controllen = 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    static const int fds[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)
        if (fcntl(fds[i], F_GETFD) < 0) /* closed: a socket opened now would take its number */
            run_in_python(argc, argv);
    if (argc < 2)
        run_in_python(argc, argv);
    const char *path = getenv(SOCKET_ENV);
    if (!path || !*path)
        path = DEFAULT_SOCKET;

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return fail(UNREACHABLE, path, "", ENAMETOOLONG);
    strcpy(addr.sun_path, path);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return fail(UNREACHABLE, path, "", errno);
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno == ENOENT || errno == ECONNREFUSED) {
            close(sock);
            run_in_python(argc, argv);
        }
        return fail(UNREACHABLE, path, "", errno);
    }

    size_t size = 0;
    for (int i = 1; i < argc; i++)
        size += strlen(argv[i]) + 1;
    char *payload = malloc(size), *end = payload;
    if (!payload)
        return fail(UNREACHABLE, path, "", errno);
    for (int i = 1; i < argc; i++)
        end = stpcpy(end, argv[i]) + 1; /* each argument with its NUL */

    if (send_all(sock, payload, size, fds) < 0 || shutdown(sock, SHUT_WR) < 0)
        return fail("the hook daemon at", path, " failed before answering", errno);
    unsigned char status;
    ssize_t n;
    do
        n = read(sock, &status, 1);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return fail("the hook daemon at", path, " failed before answering", errno);
    if (n == 0)
        return fail("the hook daemon at", path, " closed the connection before answering", 0);
    return status;
}
