/*
 * bin/exec-as of the envd bundle: become a user, then exec a program.
 *
 *   exec-as UID GID GROUPS CTTY -- PROGRAM [ARGS...]
 *
 * GROUPS is a comma-separated list of supplementary group ids ("-" for none); CTTY is 1 to make
 * stdin (a PTY slave) the controlling terminal of the new session.
 *
 * Why it exists: CPython's subprocess can only use vfork() when it does not have to change user
 * or run a preexec hook; otherwise it fork()s the whole envd process, which costs several
 * milliseconds per command at envd's size. envd therefore spawns this static helper with vfork
 * (as root, in a new session, with the right cwd, env and fds) and the helper does the few
 * privileged steps before exec, keeping the command round trip close to the cost of exec itself.
 * Static, because the image may have no libc.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MAX_GROUPS 256

static void fail(const char *what, const char *arg) {
    fprintf(stderr, "exec-as: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(errno));
    /* 126/127 as a shell reports "cannot execute" and "not found". */
    _exit(errno == ENOENT ? 127 : 126);
}

static unsigned long parse_id(const char *s) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
        errno = EINVAL;
        fail("bad id", s);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc < 7 || strcmp(argv[5], "--") != 0) {
        fprintf(stderr, "usage: exec-as UID GID GROUPS CTTY -- PROGRAM [ARGS...]\n");
        return 2;
    }
    uid_t uid = (uid_t)parse_id(argv[1]);
    gid_t gid = (gid_t)parse_id(argv[2]);
    gid_t groups[MAX_GROUPS];
    size_t ngroups = 0;
    if (strcmp(argv[3], "-") != 0) {
        char *list = argv[3];
        for (char *save = NULL, *g = strtok_r(list, ",", &save); g != NULL && ngroups < MAX_GROUPS;
             g = strtok_r(NULL, ",", &save)) {
            groups[ngroups++] = (gid_t)parse_id(g);
        }
    }
    if (strcmp(argv[4], "1") == 0 && ioctl(0, TIOCSCTTY, 0) != 0) fail("TIOCSCTTY", NULL);
    if (setgroups(ngroups, groups) != 0) fail("setgroups", NULL);
    if (setgid(gid) != 0) fail("setgid", argv[2]);
    if (setuid(uid) != 0) fail("setuid", argv[1]);
    execvp(argv[6], &argv[6]);
    fail("exec", argv[6]);
    return 127;
}
