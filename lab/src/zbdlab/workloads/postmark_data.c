/* zbdlab: PostMark's file contents from a data file (LD_PRELOAD).
 *
 * PostMark 1.51 fills one buffer with random printable characters at start (32 + a random number
 * below 95) and writes every file from that buffer; it has no option to write other data. The ZBD
 * paper changed PostMark to write real mail. This shim leaves PostMark's operations alone (which
 * files, how many bytes, in which calls) and replaces only the bytes its writes to regular files
 * carry: they come from the file named by ZBDLAB_POSTMARK_DATA, read as one stream from a cursor
 * that moves on with every write (and wraps at the end), so each file holds different text.
 *
 * Interposed: fwrite (buffered I/O, PostMark's default) and write (`set buffering false`). glibc's
 * stdio calls its internal write, not this one, so no byte is replaced twice. Writes to anything
 * but a regular file (PostMark's report on stdout) pass through untouched. Without the variable, or
 * when the file cannot be read, every call passes through and the cause goes to stderr once.
 *
 * Built by zbdlab (cc -O2 -shared -fPIC) into its cache; no build step of its own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const unsigned char *data;
static size_t data_len, cursor;
static unsigned long long replaced;
static int ready; /* 0: not tried, 1: data mapped, -1: pass through */
static ssize_t (*real_write)(int, const void *, size_t);
static size_t (*real_fwrite)(const void *, size_t, size_t, FILE *);

static void setup(void) {
    if (ready)
        return;
    ready = -1;
    real_write = dlsym(RTLD_NEXT, "write");
    real_fwrite = dlsym(RTLD_NEXT, "fwrite");
    const char *path = getenv("ZBDLAB_POSTMARK_DATA");
    if (!path || !*path)
        return;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        fprintf(stderr, "zbdlab postmark data: cannot read %s; PostMark writes its own bytes\n", path);
        if (fd >= 0)
            close(fd);
        return;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "zbdlab postmark data: cannot map %s; PostMark writes its own bytes\n", path);
        return;
    }
    data = map;
    data_len = (size_t)st.st_size;
    ready = 1;
}

static int regular(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

/* The next `len` bytes of the data stream, copied into `out`. */
static void next_bytes(unsigned char *out, size_t len) {
    size_t done = 0;
    while (done < len) {
        size_t n = data_len - cursor;
        if (n > len - done)
            n = len - done;
        memcpy(out + done, data + cursor, n);
        done += n;
        cursor = (cursor + n) % data_len;
    }
    replaced += len;
}

ssize_t write(int fd, const void *buf, size_t len) {
    setup();
    if (ready != 1 || len == 0 || !regular(fd))
        return real_write(fd, buf, len);
    unsigned char *copy = malloc(len);
    if (!copy)
        return real_write(fd, buf, len);
    next_bytes(copy, len);
    ssize_t n = real_write(fd, copy, len);
    free(copy);
    return n;
}

size_t fwrite(const void *buf, size_t size, size_t count, FILE *fp) {
    setup();
    size_t len = size * count;
    if (ready != 1 || len == 0 || (count && len / count != size) || !regular(fileno(fp)))
        return real_fwrite(buf, size, count, fp);
    unsigned char *copy = malloc(len);
    if (!copy)
        return real_fwrite(buf, size, count, fp);
    next_bytes(copy, len);
    size_t n = real_fwrite(copy, size, count, fp);
    free(copy);
    return n;
}

/* How many bytes were replaced, for the run's record (stderr, after PostMark's own report). */
__attribute__((destructor)) static void report(void) {
    if (ready == 1)
        fprintf(stderr, "zbdlab postmark data: %llu bytes replaced\n", replaced);
}
