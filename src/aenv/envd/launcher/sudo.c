/*
 * bin/sudo of the envd bundle: passwordless sudo for sandboxes whose runtime forbids setuid.
 *
 * gVisor (runsc 20240729) sets no_new_privs on every task, so the real, setuid sudo cannot
 * gain root. This stand-in asks envd, which runs as root, to run the command instead: it sends
 * the request and its own stdin/stdout/stderr (SCM_RIGHTS) over envd's Unix socket, waits, and
 * exits with the command's status. The request carries this process's credentials
 * (SCM_CREDENTIALS: the kernel refuses a pid or uid that is not the sender's own), and envd
 * decides from the uid (envd/sudoers.py). SO_PEERCRED would be simpler, but gVisor answers it
 * with the credentials of the task that asks, so envd would see every caller as root.
 *
 *   sudo [-n] [-E] [-H] [-i | -s] [-u USER] [--] [VAR=value ...] COMMAND [ARGS...]
 *
 * Request, in one sendmsg with SCM_RIGHTS (stdin, stdout, stderr) and SCM_CREDENTIALS: a
 * 4-byte big-endian length, then NUL-terminated strings "aenv-sudo-1", user, cwd, flags ("E", "i", "s" or ""), the
 * number of argv strings, argv..., the number of env strings, env... Reply: a 4-byte big-endian
 * exit status, or 0xffffffff followed by an error message. If this process dies, envd sees the
 * socket close and kills the command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <unistd.h>

#define SOCKET_PATH "/run/aenv/sudo.sock"

extern char **environ;

static char *buf;
static size_t len, cap;

static void put(const char *s) {
    size_t n = strlen(s) + 1;
    if (len + n > cap) {
        cap = (len + n) * 2 + 4096;
        buf = realloc(buf, cap);
        if (buf == NULL) { perror("sudo"); exit(1); }
    }
    memcpy(buf + len, s, n);
    len += n;
}

static void put_count(size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%zu", n);
    put(tmp);
}

static void add_flag(char *flags, char flag) {
    if (strchr(flags, flag) == NULL) {
        size_t n = strlen(flags);
        flags[n] = flag;
        flags[n + 1] = '\0';
    }
}

static int usage(void) {
    fprintf(stderr, "usage: sudo [-n] [-E] [-H] [-i | -s] [-u user] [--] [VAR=value] command\n");
    return 1;
}

int main(int argc, char **argv) {
    const char *user = "root";
    char flags[4] = "";
    /* -l / -v: whether the caller may sudo at all, asked of envd by running "true" as root. */
    int check = 0;
    static char *probe[] = {"true", NULL};
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] != '\0'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) { i++; break; }
        if (strcmp(a, "-u") == 0 || strcmp(a, "--user") == 0) {
            if (++i >= argc) return usage();
            user = argv[i];
            continue;
        }
        if (strncmp(a, "--user=", 7) == 0) { user = a + 7; continue; }
        if (strcmp(a, "-l") == 0 || strcmp(a, "--list") == 0) { check = 'l'; break; }
        if (strcmp(a, "-v") == 0 || strcmp(a, "--validate") == 0) { check = 'v'; break; }
        if (strcmp(a, "-k") == 0 || strcmp(a, "-K") == 0) return 0;
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf("aenv sudo (envd stand-in for setuid sudo)\n");
            return 0;
        }
        /* Combined single-letter flags such as -nE or -iu (a trailing u takes the next arg). */
        for (const char *p = a + 1; *p; p++) {
            switch (*p) {
            case 'n': case 'H': case 'S': case 'b': case 'P': break;
            case 'E': add_flag(flags, 'E'); break;
            case 'i': add_flag(flags, 'i'); break;
            case 's': add_flag(flags, 's'); break;
            case 'u':
                if (p[1] != '\0') { user = p + 1; p += strlen(p) - 1; }
                else if (++i < argc) user = argv[i];
                else return usage();
                break;
            default:
                fprintf(stderr, "sudo: option -%c is not supported here\n", *p);
                return usage();
            }
        }
    }
    if (check) {
        user = "root";
        flags[0] = '\0';
        argv = probe;
        argc = 1;
        i = 0;
    }
    if (i >= argc && !strchr(flags, 'i') && !strchr(flags, 's')) return usage();

    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == NULL) strcpy(cwd, "/");
    put("aenv-sudo-1");
    put(user);
    put(cwd);
    put(flags);
    put_count((size_t)(argc - i));
    for (int k = i; k < argc; k++) put(argv[k]);
    size_t envc = 0;
    for (char **e = environ; *e; e++) envc++;
    put_count(envc);
    for (char **e = environ; *e; e++) put(*e);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, SOCKET_PATH, sizeof addr.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fprintf(stderr, "sudo: cannot reach envd at %s: %s\n", SOCKET_PATH, strerror(errno));
        return 1;
    }
    /* Credentials on every part of a request too big for one sendmsg, too: envd refuses a
     * request whose parts do not all carry the same sender. */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
    uint32_t size = htonl((uint32_t)len);
    int fds[3] = {0, 1, 2};
    struct ucred self = {.pid = getpid(), .uid = getuid(), .gid = getgid()};
    struct iovec iov[2] = {{.iov_base = &size, .iov_len = sizeof size},
                           {.iov_base = buf, .iov_len = len}};
    union {
        char bytes[CMSG_SPACE(sizeof fds) + CMSG_SPACE(sizeof self)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control.bytes,
                         .msg_controllen = sizeof control.bytes};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    cmsg = CMSG_NXTHDR(&msg, cmsg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_CREDENTIALS;
    cmsg->cmsg_len = CMSG_LEN(sizeof self);
    memcpy(CMSG_DATA(cmsg), &self, sizeof self);
    ssize_t first;
    do first = sendmsg(fd, &msg, 0); while (first < 0 && errno == EINTR);
    if (first < 0) { perror("sudo"); return 1; }
    /* The rest, if the socket took only part. */
    size_t sent = (size_t)first;
    size_t total = sizeof size + len;
    while (sent < total) {
        ssize_t n = sent < sizeof size
            ? write(fd, (char *)&size + sent, sizeof size - sent)
            : write(fd, buf + (sent - sizeof size), total - sent);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("sudo");
            return 1;
        }
        sent += (size_t)n;
    }
    unsigned char reply[4];
    size_t got = 0;
    while (got < sizeof reply) {
        ssize_t n = read(fd, reply + got, sizeof reply - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { fprintf(stderr, "sudo: envd closed the connection\n"); return 1; }
        got += (size_t)n;
    }
    uint32_t status = ((uint32_t)reply[0] << 24) | ((uint32_t)reply[1] << 16) |
                      ((uint32_t)reply[2] << 8) | reply[3];
    if (status == 0xffffffffu) {
        char message[1024];
        ssize_t n = read(fd, message, sizeof message - 1);
        message[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "sudo: %s\n", message);
        return 1;
    }
    if (check == 'l' && status == 0)
        printf("User may run the following commands on this sandbox:\n    (ALL) NOPASSWD: ALL\n");
    return (int)status;
}
