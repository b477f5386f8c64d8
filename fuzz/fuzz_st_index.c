/*
 * fuzz_st_index.c — libFuzzer harness for the sharded-checkpoint index reader
 * (ls_st_model_open on a directory holding model.safetensors.index.json).
 *
 * At start-up a private temp directory gets two valid shards: a.safetensors
 * (tensors "x" F32 [2], "y" BF16 [3]) and b.safetensors ("z" F16 [1, 2]). Each input
 * becomes model.safetensors.index.json there; then ls_st_model_open, every tensor by
 * index and by name, ls_st_read_f32, ls_st_model_close.
 * Oracles: a rejection names the directory or the index file; an accepted model's
 * names are sorted and unique, ls_st_model_find finds each, and each tensor is one
 * of the shard's own.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "longstraw/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char g_dir[256], g_index[320];

static void write_file(const char *path, const void *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    close(fd);
}

static void write_shard(const char *name, const char *header, size_t data_bytes) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    size_t hl = strlen(header);
    unsigned char buf[512];
    if (8 + hl + data_bytes > sizeof buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_bytes; i++) buf[8 + hl + i] = (unsigned char)(0x3c + i);
    write_file(path, buf, 8 + hl + data_bytes);
}

static void cleanup(void) {
    char p[400];
    static const char *names[] = {"a.safetensors", "b.safetensors", LS_ST_INDEX_NAME};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/ls-fuzz-index-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror(g_dir);
        abort();
    }
    snprintf(g_index, sizeof g_index, "%s/%s", g_dir, LS_ST_INDEX_NAME);
    write_shard("a.safetensors",
                "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"y\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}  ",
                14);
    write_shard("b.safetensors", "{\"z\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[0,4]}}   ", 4);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_file(g_index, data, size);
    ls_st_model m;
    ls_status s = ls_st_model_open(&m, g_dir);
    if (s != LS_OK) {
        fuzz_check_rejection(s, g_dir); /* g_dir is a prefix of the index and shard paths */
        FUZZ_CHECK(m.files == NULL && m.by_name == NULL && m.n_tensors == 0, "a failed open left state behind");
        ls_st_model_close(&m);
        return 0;
    }
    FUZZ_CHECK(m.n_tensors >= 1 && m.n_tensors <= 3 && m.n_files >= 1 && m.n_files <= 2, "%lld tensors in %lld files",
               (long long)m.n_tensors, (long long)m.n_files);
    for (int64_t i = 0; i < ls_st_model_count(&m); i++) {
        const ls_st_tensor *t = ls_st_model_at(&m, i);
        if (i) FUZZ_CHECK(strcmp(ls_st_model_at(&m, i - 1)->name, t->name) < 0, "names not sorted/unique");
        FUZZ_CHECK(ls_st_model_find(&m, t->name) == t, "find(\"%s\")", t->name);
        int owned = 0;
        for (int64_t f = 0; f < m.n_files; f++) owned |= ls_st_find(&m.files[f], t->name) == t;
        FUZZ_CHECK(owned, "\"%s\" is in none of the shards", t->name);
        float buf[8];
        FUZZ_CHECK(t->numel <= 8 && ls_st_read_f32(t, buf, t->numel, NULL) == LS_OK, "read \"%s\"", t->name);
    }
    ls_st_model_close(&m);
    return 0;
}
