// Drop the model file's pages that llama.cpp copied out of its mapping at load time.
//
// With mmap, llama.cpp maps the whole GGUF (MAP_POPULATE: every page resident) and points the
// weights kept in plain CPU memory into that mapping. Weights it puts in another buffer (the CPU's
// repacked layouts, e.g. Q4_K -> q4_K_8x8 on AVX2/AVX-512/NEON, or a GPU) are copied there, but
// their source pages stay resident in the mapping although nothing reads them again: on
// Qwen2.5-Coder-1.5B Q4_K_M that is 597 MiB of 1,060 counted twice (llama.cpp issue 16761).
// MADV_DONTNEED gives those pages back; the mapping stays valid (read-only, file-backed), so a
// stray read would fault the same bytes in from the file again: nothing can change what is computed.
//
// Two places do it: after loading, the pages of exactly the copied weights (kvpot_model_release_copied);
// and while loading, from the loader's progress callback, every page of the file's read-only mappings
// (kvpot_load_progress_release), so that each copy does not sit beside its source until the end. The
// second also drops the pages of weights read in place; they fault back from the page cache the first
// time a graph reads them.
//
// The same progress callback stops the load when a signal is waiting (kvpot-abort.cpp): loading a 1 GB
// model from a phone's storage takes long enough that a Ctrl-C should not wait for its end.
#include "kvpot.h"
#include "kvpot-abort.h"

#include "llama-model.h"

#include "ggml-backend.h"
#include "gguf.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define KVPOT_CAN_RELEASE 1
#else
#define KVPOT_CAN_RELEASE 0
#endif

#if defined(__linux__)
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <cstdio>
#define KVPOT_CAN_RELEASE_WHILE_LOADING 1
#else
#define KVPOT_CAN_RELEASE_WHILE_LOADING 0
#endif

namespace {

struct file_tensor {
    size_t       beg, end;   // byte range in the file
    bool         mapped;     // read in place from llama.cpp's mapping
};

// the name llama.cpp's loader gives the CPU buffer it wraps around its mapping
// (ggml_backend_cpu_buffer_from_ptr's buffer type)
bool is_cpu_mapping(const ggml_backend_buffer_t buf) {
    return buf && std::strcmp(ggml_backend_buffer_name(buf), "CPU_Mapped") == 0;
}

} // namespace

int64_t kvpot_model_release_copied(const struct llama_model * model, const char * path) {
    if (!model || !path) {
        return KVPOT_ERR_ARG;
    }
#if !KVPOT_CAN_RELEASE
    return 0;
#else
    gguf_init_params gp = { /*no_alloc =*/ true, /*ctx =*/ nullptr };
    gguf_context * gg = gguf_init_from_file(path, gp);
    if (!gg) {
        return KVPOT_ERR_ARG;
    }
    const size_t data0 = gguf_get_data_offset(gg);

    // every tensor of the file: where it lies, and whether it is still read from the mapping (its address
    // minus its file offset is the mapping's base, the same for all) or was copied elsewhere
    std::vector<file_tensor> ts;
    uint8_t * base = nullptr;
    bool one_base = true;
    std::vector<std::pair<uint8_t *, uint8_t *>> spans; // the CPU_Mapped buffers: the part still mapped
    for (int64_t i = 0; i < gguf_get_n_tensors(gg); ++i) {
        const ggml_tensor * t = model->get_tensor(gguf_get_tensor_name(gg, i));
        const size_t beg = data0 + gguf_get_tensor_offset(gg, i);
        const size_t end = beg + gguf_get_tensor_size(gg, i);
        if (!t || !t->data) {  // a tensor the model does not use: its pages are left as they are
            ts.push_back({ beg, end, true });
            continue;
        }
        const bool mapped = is_cpu_mapping(t->buffer);
        if (mapped) {
            uint8_t * b = (uint8_t *) t->data - beg;
            one_base = one_base && (base == nullptr || base == b);
            base = b;
            auto * lo = (uint8_t *) ggml_backend_buffer_get_base(t->buffer);
            std::pair<uint8_t *, uint8_t *> span = { lo, lo + ggml_backend_buffer_get_size(t->buffer) };
            if (std::find(spans.begin(), spans.end(), span) == spans.end()) {
                spans.push_back(span);
            }
        }
        ts.push_back({ beg, end, mapped });
    }
    gguf_free(gg);
    // nothing mapped (--no-mmap, a GPU holding everything) or a layout this code does not know: leave it
    if (!base || !one_base) {
        return 0;
    }

    // runs of copied tensors with no other tensor between them, rounded inward to whole pages (a page
    // shared with a mapped tensor stays), and only inside a CPU_Mapped buffer: llama.cpp unmaps the
    // mapping outside those, and that address range may hold other memory by now
    std::sort(ts.begin(), ts.end(), [](const file_tensor & a, const file_tensor & b) { return a.beg < b.beg; });
    const size_t page = (size_t) sysconf(_SC_PAGESIZE);
    int64_t released = 0;
    auto release = [&](size_t beg, size_t end) {
        for (const auto & s : spans) {
            uintptr_t lo = std::max((uintptr_t) (base + beg), (uintptr_t) s.first);
            uintptr_t hi = std::min((uintptr_t) (base + end), (uintptr_t) s.second);
            lo = (lo + page - 1) & ~(uintptr_t) (page - 1);
            hi = hi & ~(uintptr_t) (page - 1);
            if (hi > lo && madvise((void *) lo, hi - lo, MADV_DONTNEED) == 0) {
                released += (int64_t) (hi - lo);
            }
        }
    };
    for (size_t i = 0; i < ts.size();) {
        if (ts[i].mapped) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j + 1 < ts.size() && !ts[j + 1].mapped) {
            ++j;
        }
        release(ts[i].beg, ts[j].end);
        i = j + 1;
    }
    return released;
#endif
}

bool kvpot_load_progress_release(float progress, void * user_data) {
    (void) progress;
    if (kvpot_signal_waiting()) {
        return false;  // llama.cpp cancels the load
    }
#if KVPOT_CAN_RELEASE_WHILE_LOADING
    const char * path = (const char *) user_data;
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        return true;
    }
    // the file's mappings as llama.cpp makes them (by device and inode: a path in /proc/self/maps may be
    // spelled differently): shared, read-only, from offset 0. Never a writable one: MADV_DONTNEED on a
    // private writable mapping would throw away its changes
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    FILE * maps = std::fopen("/proc/self/maps", "r");
    if (!maps) {
        return true;
    }
    char line[4096];
    while (std::fgets(line, sizeof(line), maps)) {
        unsigned long lo = 0, hi = 0, off = 0, ino = 0;
        unsigned int dmaj = 0, dmin = 0;
        char perms[8] = {};
        if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin, &ino) != 7) {
            continue;
        }
        if (ino == (unsigned long) st.st_ino && dmaj == major(st.st_dev) && dmin == minor(st.st_dev) &&
            std::strcmp(perms, "r--s") == 0 && off == 0 && hi > lo) {
            ranges.emplace_back((uintptr_t) lo, (uintptr_t) hi);
        }
        // a line longer than the buffer (a very long path): skip its rest
        while (!std::strchr(line, '\n') && std::fgets(line, sizeof(line), maps)) {
        }
    }
    std::fclose(maps);
    // this thread is the loader's, and kvpot maps or unmaps the file nowhere else while it loads, so
    // these ranges are still the file's
    for (const auto & r : ranges) {
        madvise((void *) r.first, r.second - r.first, MADV_DONTNEED);
    }
#else
    (void) user_data;
#endif
    return true;
}
