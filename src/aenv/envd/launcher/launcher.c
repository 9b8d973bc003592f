/*
 * bin/envd of the envd bundle: a static launcher that runs the bundled CPython with the bundled
 * dynamic loader, so envd starts in any Linux image, whatever its libc (glibc, musl or none).
 *
 * The bundle may be mounted anywhere, so the launcher finds its own directory at run time
 * (/proc/self/exe, or argv[0] and $PATH where /proc is not mounted) and execs
 *
 *   <root>/lib/<loader> --library-path <root>/lib <root>/lib/python3 -P -S -s -B -m aenv.envd ARGS
 *
 * with PYTHONHOME=<root> and PYTHONPATH=<site-packages>. The loader is called directly rather
 * than named in the interpreter's PT_INTERP because that path is absolute and the image's own
 * (or missing) libc lives there. --library-path is a loader option, not LD_LIBRARY_PATH, so it
 * reaches the interpreter only: nothing envd spawns inherits it. envd drops PYTHONHOME and
 * PYTHONPATH from its own environment at start. Variables starting with PYTHON or LD_ that the
 * image sets are dropped here: they would otherwise steer our interpreter or our loader.
 *
 * The build defines ENVD_LOADER (the loader's file name, from the interpreter's PT_INTERP),
 * ENVD_PYTHON (the interpreter's path under the root) and ENVD_SITE (site-packages under it).
 * Linked with gcc -static: the image may have no libc to link against.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ENVD_LOADER
#error "ENVD_LOADER must be defined at build time"
#endif
#ifndef ENVD_PYTHON
#define ENVD_PYTHON "lib/python3"
#endif
#ifndef ENVD_SITE
#error "ENVD_SITE must be defined at build time"
#endif

extern char **environ;

static void die(const char *what) {
    fprintf(stderr, "envd launcher: %s: %s\n", what, strerror(errno));
    exit(127);
}

/* a, sep and b concatenated into a fresh string. */
static char *concat(const char *a, const char *sep, const char *b) {
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *out = malloc(n);
    if (out == NULL) die("malloc");
    snprintf(out, n, "%s%s%s", a, sep, b);
    return out;
}

static char *join(const char *a, const char *b) { return concat(a, "/", b); }

/* argv[0] without a slash was found through $PATH by whoever started us: search it the same way. */
static int search_path(const char *name, char *out) {
    const char *path = getenv("PATH");
    if (path == NULL) path = "/usr/local/bin:/usr/bin:/bin";
    char *copy = strdup(path);
    if (copy == NULL) die("strdup");
    int found = 0;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir != NULL;
         dir = strtok_r(NULL, ":", &save)) {
        char *candidate = join(dir, name);
        if (access(candidate, X_OK) == 0 && realpath(candidate, out) != NULL) found = 1;
        free(candidate);
        if (found) break;
    }
    free(copy);
    return found;
}

/* The absolute, symlink-free path of this executable. */
static void self_path(const char *argv0, char *out) {
    ssize_t n = readlink("/proc/self/exe", out, PATH_MAX - 1);
    if (n > 0) {
        out[n] = '\0';
        return;
    }
    /* No /proc (a bare chroot): fall back to argv[0]. */
    if (strchr(argv0, '/') != NULL) {
        if (realpath(argv0, out) == NULL) die(argv0);
        return;
    }
    if (!search_path(argv0, out)) {
        errno = ENOENT;
        die(argv0);
    }
}

/* Strip the last path component in place ("/a/b/c" -> "/a/b"). */
static void parent(char *path) {
    char *slash = strrchr(path, '/');
    if (slash == NULL) return;
    if (slash == path) slash[1] = '\0'; /* keep "/" */
    else *slash = '\0';
}

static int dropped(const char *entry) {
    return strncmp(entry, "PYTHON", 6) == 0 || strncmp(entry, "LD_", 3) == 0;
}

int main(int argc, char **argv) {
    char root[PATH_MAX];
    self_path(argc > 0 ? argv[0] : "envd", root);
    parent(root); /* <root>/bin */
    parent(root); /* <root> */

    char *lib = join(root, "lib");
    char *loader = join(lib, ENVD_LOADER);
    char *python = join(root, ENVD_PYTHON);

    /* The interpreter's environment: the caller's, minus PYTHON* and LD_*, plus ours. */
    size_t n_env = 0;
    while (environ[n_env] != NULL) n_env++;
    char **envp = calloc(n_env + 3, sizeof(char *));
    if (envp == NULL) die("calloc");
    size_t e = 0;
    for (size_t i = 0; i < n_env; i++)
        if (!dropped(environ[i])) envp[e++] = environ[i];
    envp[e++] = concat("PYTHONHOME=", "", root);
    envp[e++] = concat("PYTHONPATH=", "", join(root, ENVD_SITE));
    envp[e] = NULL;

    /*
     * -P: never put the current directory on sys.path (the sandbox's cwd is the user's).
     * -S/-s: no site module and no user site; PYTHONPATH names the one site-packages.
     * -B: the bundle is read-only and ships its bytecode already compiled.
     * bundle.py's PYTHON_FLAGS is the same list, for its own check of the built bundle.
     */
    const char *fixed[] = {loader, "--library-path", lib, python,
                           "-P", "-S", "-s", "-B", "-m", "aenv.envd"};
    size_t n_fixed = sizeof(fixed) / sizeof(fixed[0]);
    char **args = calloc(n_fixed + (size_t)argc + 1, sizeof(char *));
    if (args == NULL) die("calloc");
    size_t a = 0;
    for (size_t i = 0; i < n_fixed; i++) args[a++] = (char *)fixed[i];
    for (int i = 1; i < argc; i++) args[a++] = argv[i];
    args[a] = NULL;

    execve(loader, args, envp);
    die(loader);
    return 127;
}
