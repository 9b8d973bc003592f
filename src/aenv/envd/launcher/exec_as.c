/*
 * bin/exec-as of the envd bundle: become a user, then exec a program.
 *
 *   exec-as UID GID GROUPS CTTY -- PROGRAM [ARGS...]
 *
 * GROUPS is a comma-separated list of supplementary group ids ("-" for none); CTTY is 1 to make
 * stdin (a PTY slave) the controlling terminal of the new session. PROGRAM is looked up in the
 * environment's PATH as execvp(3) does, a file exec refuses as ENOEXEC runs under /bin/sh.
 *
 * Why it exists: CPython's subprocess can only use vfork() when it does not have to change user
 * or run a preexec hook; otherwise it fork()s the whole envd process, which costs several
 * milliseconds per command at envd's size. envd therefore spawns this helper with vfork (as
 * root, in a new session, with the right cwd, env and fds) and the helper does the few
 * privileged steps before exec, keeping the command round trip close to the cost of exec itself.
 *
 * Why without libc (-nostdlib, its own _start and system calls): it sits on every command's
 * path, and under gVisor the start-up of a static glibc binary (its relocations, TLS, stdio)
 * cost 4-6 ms per exec (measured inside a sandbox: Popen of /bin/true through the glibc helper
 * 13.4-16.6 ms, through a 9 KB freestanding one 9.2-12.6, directly 8.9-10.7). Static, because
 * the image may have no libc.
 */
#include <asm/ioctls.h>
#include <asm/unistd.h>
#include <linux/errno.h>
#include <linux/limits.h>

#define MAX_GROUPS 256

typedef unsigned int id32;

#if defined(__x86_64__)
static long sys3(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}
/* The kernel enters with %rsp at argc; the C entry gets that address as its argument. */
__asm__(".text\n.globl _start\n_start:\n xor %rbp, %rbp\n mov %rsp, %rdi\n and $-16, %rsp\n"
        " call exec_as_main\n hlt\n");
#elif defined(__aarch64__)
static long sys3(long nr, long a, long b, long c) {
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
    return x0;
}
__asm__(".text\n.globl _start\n_start:\n mov x29, #0\n mov x0, sp\n bl exec_as_main\n brk #0\n");
#else
#error "exec-as: add this architecture's system call convention"
#endif

static unsigned long length(const char *s) {
    unsigned long n = 0;
    while (s[n] != '\0') n++;
    return n;
}

static int same(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) a++, b++;
    return *a == *b;
}

static void say(const char *s) { sys3(__NR_write, 2, (long)s, (long)length(s)); }

static const char *reason(long err) {
    switch (err) {
    case ENOENT: return "No such file or directory";
    case EACCES: return "Permission denied";
    case EPERM: return "Operation not permitted";
    case ENOEXEC: return "Exec format error";
    case ENOTDIR: return "Not a directory";
    case ELOOP: return "Too many levels of symbolic links";
    case E2BIG: return "Argument list too long";
    case ENOMEM: return "Cannot allocate memory";
    case ETXTBSY: return "Text file busy";
    case EINVAL: return "Invalid argument";
    case ENAMETOOLONG: return "File name too long";
    case EISDIR: return "Is a directory";
    default: return "error";
    }
}

/* Exit as a shell reports it: 127 "not found", 126 "cannot execute". */
__attribute__((noreturn)) static void fail(const char *what, const char *arg, long err) {
    say("exec-as: ");
    say(what);
    if (arg != 0) {
        say(" ");
        say(arg);
    }
    say(": ");
    say(reason(err));
    say("\n");
    for (;;) sys3(__NR_exit_group, err == ENOENT ? 127 : 126, 0, 0);
}

static id32 parse_id(const char *s, const char *end) {
    unsigned long v = 0;
    if (s == end) fail("bad id", 0, EINVAL);
    for (; s != end; s++) {
        if (*s < '0' || *s > '9') fail("bad id", 0, EINVAL);
        v = v * 10 + (unsigned long)(*s - '0');
        if (v > 0xffffffffUL) fail("bad id", 0, EINVAL);
    }
    return (id32)v;
}

static id32 parse_whole_id(const char *s) { return parse_id(s, s + length(s)); }

static const char *env_path(char **envp) {
    for (; *envp != 0; envp++) {
        const char *e = *envp;
        if (e[0] == 'P' && e[1] == 'A' && e[2] == 'T' && e[3] == 'H' && e[4] == '=') return e + 5;
    }
    return "/bin:/usr/bin"; /* glibc's execvp default */
}

/* execve, and for a file the kernel cannot run (no #!), /bin/sh on it as execvp does:
 * argv[-1] is the "--" slot, free to hold the shell's name. */
static long run(const char *file, char **argv, char **envp) {
    long err = sys3(__NR_execve, (long)file, (long)argv, (long)envp);
    if (err == -ENOEXEC) {
        argv[-1] = "/bin/sh";
        argv[0] = (char *)file;
        fail("exec", "/bin/sh", -sys3(__NR_execve, (long)"/bin/sh", (long)(argv - 1), (long)envp));
    }
    return -err;
}

__attribute__((noreturn, used)) void exec_as_main(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    char **envp = argv + argc + 1;
    if (argc < 7 || !same(argv[5], "--")) {
        say("usage: exec-as UID GID GROUPS CTTY -- PROGRAM [ARGS...]\n");
        for (;;) sys3(__NR_exit_group, 2, 0, 0);
    }
    id32 uid = parse_whole_id(argv[1]);
    id32 gid = parse_whole_id(argv[2]);
    id32 groups[MAX_GROUPS];
    long ngroups = 0;
    if (!same(argv[3], "-")) {
        const char *g = argv[3];
        while (*g != '\0' && ngroups < MAX_GROUPS) {
            const char *end = g;
            while (*end != '\0' && *end != ',') end++;
            groups[ngroups++] = parse_id(g, end);
            g = *end == ',' ? end + 1 : end;
        }
    }
    long err;
    if (same(argv[4], "1") && (err = sys3(__NR_ioctl, 0, TIOCSCTTY, 0)) != 0) {
        fail("TIOCSCTTY", 0, -err);
    }
    if ((err = sys3(__NR_setgroups, ngroups, (long)groups, 0)) != 0) fail("setgroups", 0, -err);
    if ((err = sys3(__NR_setgid, gid, 0, 0)) != 0) fail("setgid", argv[2], -err);
    if ((err = sys3(__NR_setuid, uid, 0, 0)) != 0) fail("setuid", argv[1], -err);

    char **args = argv + 6;
    const char *program = args[0];
    for (const char *c = program; *c != '\0'; c++) {
        if (*c == '/') fail("exec", program, run(program, args, envp));
    }
    /* execvp's search: an empty entry is the current directory; EACCES is kept (a later entry
     * may still run), anything but "not here" stops the search. */
    char path[PATH_MAX];
    unsigned long name = length(program);
    long seen = ENOENT;
    const char *dir = env_path(envp);
    for (;;) {
        const char *end = dir;
        while (*end != '\0' && *end != ':') end++;
        unsigned long n = (unsigned long)(end - dir);
        if (n + 1 + name + 1 <= sizeof path) {
            unsigned long at = 0;
            for (unsigned long i = 0; i < n; i++) path[at++] = dir[i];
            if (n > 0) path[at++] = '/';
            for (unsigned long i = 0; i <= name; i++) path[at++] = program[i];
            err = run(path, args, envp);
            if (err == EACCES) {
                seen = EACCES;
            } else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ENODEV &&
                       err != ETIMEDOUT) {
                fail("exec", program, err);
            }
        }
        if (*end == '\0') break;
        dir = end + 1;
    }
    fail("exec", program, seen);
}
