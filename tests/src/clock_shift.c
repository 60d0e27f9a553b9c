/* An LD_PRELOAD shim for redis-server: its wall clock (gettimeofday, and clock_gettime of
 * CLOCK_REALTIME, which TIME and a script's TIME read) runs ahead by the number of seconds
 * written in the file named by RL_CLOCK_SHIFT_FILE (a decimal number, rewritten in place by
 * the test to step the clock). The monotonic clock is left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SHIFT_BYTES 32

static const char *mapped = 0;

static long long shift_seconds(void) {
    if (!mapped) {
        const char *path = getenv("RL_CLOCK_SHIFT_FILE");
        if (!path) return 0;
        int fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        void *m = mmap(0, SHIFT_BYTES, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return 0;
        mapped = m;
    }
    char text[SHIFT_BYTES + 1];
    for (int i = 0; i < SHIFT_BYTES; i++) text[i] = ((volatile const char *)mapped)[i];
    text[SHIFT_BYTES] = 0;
    return strtoll(text, 0, 10);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += shift_seconds();
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *) = 0;
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int r = real(tv, tz);
    if (r == 0 && tv) tv->tv_sec += shift_seconds();
    return r;
}
