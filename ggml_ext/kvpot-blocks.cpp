// InfLLM block store: file layout, append, reads through the per-layer caches, representative scoring (see kvpot-blocks.h)
#include "kvpot-blocks.h"

#include "ggml.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace {

// header fields after the 8-byte magic, all little-endian uint32 (the rest of the 64 bytes is zero);
// H_K_TYPE is version 2's (there the format of K and V both; a version-1 header has zero there and f16
// rows), H_V_TYPE version 3's (zero in older headers)
enum : uint32_t { H_VERSION, H_HEADER_BYTES, H_N_LAYER, H_N_HEAD_KV, H_D_K, H_D_V, H_BLOCK_SIZE, H_K_TYPE, H_V_TYPE,
                  H_N_FIELDS };

// the row formats a store may hold: f16 (exact to llama.cpp's own f16 cache) and the two
// quantisations whose rows ggml converts without an importance matrix
bool stored_type(uint32_t t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_0;
}

// a shape field above this is a corrupt header (no model has 2^20 layers, heads or head dims)
constexpr uint32_t MAX_FIELD = 1u << 20;
// nor a block of more than 64 GiB over its layers: refusing it keeps every size below in 64 bits
constexpr uint64_t MAX_BLOCK_BYTES = 1ull << 36;

// record of (block, layer): pos i32[bs] | repr f32[H][dk] | k TK[H][bs][dk] | v TV[H][bs][dv], padded to
// 64 bytes, TK/TV the store's k_type/v_type (one ggml row per token and head). With every field <=
// MAX_FIELD and a row at most 2 bytes per value the sum is < 2^63: no overflow. Only for checked types.
uint64_t record_bytes_of(const kvpot_blocks_shape & s) {
    const uint64_t rows = (uint64_t) s.n_head_kv*s.block_size;
    const uint64_t b = 4ull*s.block_size + 4ull*s.n_head_kv*s.d_k
                     + rows*(ggml_row_size((ggml_type) s.k_type, s.d_k) + ggml_row_size((ggml_type) s.v_type, s.d_v));
    return (b + 63) & ~63ull;
}

// a shape whose block (all layers) fits MAX_BLOCK_BYTES, else why not
std::string check_shape(const kvpot_blocks_shape & s) {
    const uint32_t have[5] = {s.n_layer, s.n_head_kv, s.d_k, s.d_v, s.block_size};
    const char * names[5] = {"layers", "KV heads", "key dim", "value dim", "block_size"};
    for (int i = 0; i < 5; ++i) {
        if (have[i] == 0 || have[i] > MAX_FIELD) {
            return std::string(names[i]) + " " + std::to_string(have[i]) + " is out of range";
        }
    }
    const uint32_t types[2] = {s.k_type, s.v_type};
    const uint32_t dims[2]  = {s.d_k, s.d_v};
    for (int i = 0; i < 2; ++i) {
        const char * what = i == 0 ? "K" : "V";
        if (!stored_type(types[i])) {
            return std::string(what) + " type " + std::to_string(types[i]) + " is not f16, q8_0 or q4_0";
        }
        const auto blck = (uint32_t) ggml_blck_size((ggml_type) types[i]);
        if (dims[i] % blck != 0) {
            return std::string(ggml_type_name((ggml_type) types[i])) + " stores rows in blocks of " + std::to_string(blck)
                 + " values; this model's " + (i == 0 ? "key" : "value") + " dim " + std::to_string(dims[i])
                 + " is not a multiple of it (use f16)";
        }
    }
    const uint64_t rec = record_bytes_of(s);
    if (rec > MAX_BLOCK_BYTES || rec*s.n_layer > MAX_BLOCK_BYTES) { // rec <= 2^36, n_layer <= 2^20: no overflow
        return "a block would take more than 64 GiB";
    }
    return "";
}

std::string errno_text(const std::string & what) {
    return what + ": " + std::strerror(errno);
}

// all n bytes at off through pread or pwrite, going on after a short transfer or EINTR; a file that
// ends early (cut by another process) reads as an I/O error
template <typename Byte, typename Io>
bool transfer_all(Io io, int fd, Byte * data, size_t n, uint64_t off) {
    while (n > 0) {
        const ssize_t r = io(fd, data, n, (off_t) off);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r == 0) {
                errno = EIO;
            }
            return false;
        }
        data += r; n -= (size_t) r; off += (uint64_t) r;
    }
    return true;
}

bool write_all(int fd, const void * data, size_t n, uint64_t off) {
    return transfer_all(::pwrite, fd, (const uint8_t *) data, n, off);
}

bool read_all(int fd, void * data, size_t n, uint64_t off) {
    return transfer_all(::pread, fd, (uint8_t *) data, n, off);
}

} // namespace

constexpr char kvpot_block_store::MAGIC[8];

kvpot_block_store::~kvpot_block_store() {
    if (fd >= 0) {
        close(fd);
    }
}

kvpot_block_store * kvpot_block_store::open(const std::string & path, kvpot_blocks_shape shape, uint32_t max_cached,
                                            bool create, std::string & why) {
    auto * s = new kvpot_block_store();
    std::unique_ptr<kvpot_block_store> guard(s);
    s->path = path;
    s->cfg.size = max_cached;
    if (max_cached < 1) {
        why = "max_cached_block must be at least 1";
        return nullptr;
    }
    if (create) {
        if (const std::string bad = check_shape(shape); !bad.empty()) {
            why = "block store shape: " + bad;
            return nullptr;
        }
    }
    // a new store is a new file: O_EXCL refuses any existing path (a document, a model, another
    // context's store, a symlink), so no name given here can replace a file
    s->fd = ::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC) : (O_RDWR | O_CLOEXEC), 0644);
    if (s->fd < 0 && !create && (errno == EACCES || errno == EPERM || errno == EROFS)) {
        // a store a saved context references is read-only: it is read, never written
        s->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        s->writable = false;
    }
    if (s->fd < 0) {
        why = errno == EEXIST ? "block store " + path + " already exists (a new store never replaces a file)"
                              : errno_text("block store " + path);
        return nullptr;
    }
    uint32_t f[H_N_FIELDS] = {};
    if (create) {
        uint8_t hdr[HEADER_BYTES] = {};
        memcpy(hdr, MAGIC, 8);
        f[H_VERSION] = VERSION; f[H_HEADER_BYTES] = HEADER_BYTES; f[H_N_LAYER] = shape.n_layer;
        f[H_N_HEAD_KV] = shape.n_head_kv; f[H_D_K] = shape.d_k; f[H_D_V] = shape.d_v; f[H_BLOCK_SIZE] = shape.block_size;
        f[H_K_TYPE] = shape.k_type; f[H_V_TYPE] = shape.v_type;
        memcpy(hdr + 8, f, sizeof(f));
        if (!write_all(s->fd, hdr, HEADER_BYTES, 0)) {
            why = errno_text("cannot write block store " + path);
            return nullptr;
        }
        s->shp = shape;
    } else {
        struct stat st {};
        if (fstat(s->fd, &st) != 0) {
            why = errno_text("block store " + path);
            return nullptr;
        }
        if (!S_ISREG(st.st_mode)) {
            why = path + " is not a kvpot block store (not a regular file)";
            return nullptr;
        }
        uint8_t hdr[HEADER_BYTES] = {};
        if ((uint64_t) st.st_size < HEADER_BYTES || pread(s->fd, hdr, HEADER_BYTES, 0) != (ssize_t) HEADER_BYTES) {
            why = path + " is not a kvpot block store (shorter than its header)";
            return nullptr;
        }
        if (memcmp(hdr, MAGIC, 8) != 0) {
            why = path + " is not a kvpot block store (bad magic)";
            return nullptr;
        }
        memcpy(f, hdr + 8, sizeof(f));
        if (f[H_VERSION] < 1 || f[H_VERSION] > VERSION || f[H_HEADER_BYTES] != HEADER_BYTES) {
            why = path + ": block store version " + std::to_string(f[H_VERSION]) + " is not supported (this kvpot reads "
                "versions 1 to " + std::to_string(VERSION) + ")";
            return nullptr;
        }
        if ((f[H_VERSION] == 1 && f[H_K_TYPE] != 0) || (f[H_VERSION] < 3 && f[H_V_TYPE] != 0)) {
            why = path + ": block store header is corrupt (reserved bytes are not zero)";
            return nullptr;
        }
        // version 1: f16 rows; version 2: one format for K and V
        const uint32_t k_type = f[H_VERSION] == 1 ? (uint32_t) GGML_TYPE_F16 : f[H_K_TYPE];
        const uint32_t v_type = f[H_VERSION] < 3 ? k_type : f[H_V_TYPE];
        const kvpot_blocks_shape file{f[H_N_LAYER], f[H_N_HEAD_KV], f[H_D_K], f[H_D_V], f[H_BLOCK_SIZE], k_type, v_type};
        if (const std::string bad = check_shape(file); !bad.empty()) {
            why = path + ": block store header is corrupt (" + bad + ")";
            return nullptr;
        }
        for (size_t i = 8 + sizeof(f); i < HEADER_BYTES; ++i) {
            if (hdr[i] != 0) {
                why = path + ": block store header is corrupt (reserved bytes are not zero)";
                return nullptr;
            }
        }
        const uint32_t want[5] = {shape.n_layer, shape.n_head_kv, shape.d_k, shape.d_v, shape.block_size};
        const uint32_t have[5] = {file.n_layer, file.n_head_kv, file.d_k, file.d_v, file.block_size};
        const char * names[5] = {"layers", "KV heads", "key dim", "value dim", "block_size"};
        for (int i = 0; i < 5; ++i) {
            if (want[i] && want[i] != have[i]) {
                why = path + ": block store was made for " + std::to_string(have[i]) + " " + names[i] + ", not "
                    + std::to_string(want[i]);
                return nullptr;
            }
        }
        const uint32_t want_t[2] = {shape.k_type, shape.v_type};
        const uint32_t have_t[2] = {file.k_type, file.v_type};
        for (int i = 0; i < 2; ++i) {
            if (want_t[i] && want_t[i] != have_t[i]) {
                why = path + ": block store holds " + ggml_type_name((ggml_type) have_t[i]) + (i == 0 ? " K" : " V")
                    + ", not " + (stored_type(want_t[i]) ? ggml_type_name((ggml_type) want_t[i]) : std::to_string(want_t[i]));
                return nullptr;
            }
        }
        s->shp = file;
        const uint64_t per_block = record_bytes_of(file)*file.n_layer;
        const uint64_t body = (uint64_t) st.st_size - HEADER_BYTES;
        if (body % per_block != 0) {
            why = path + " is truncated (" + std::to_string(body % per_block) + " bytes of a partial block)";
            return nullptr;
        }
        if (body / per_block > INT32_MAX) {
            why = path + ": too many blocks";
            return nullptr;
        }
        s->nblk = (uint32_t) (body / per_block);
    }
    s->rec = record_bytes_of(s->shp);
    s->caches.resize(s->shp.n_layer);
    guard.release();
    return s;
}

int64_t kvpot_block_store::append(const int32_t * pos, const float * repr, const float * k, const float * v,
                                  std::string & why) {
    if (!pos || !repr || !k || !v) {
        why = "block data is NULL";
        return -1;
    }
    if (nblk == INT32_MAX) {
        why = "block store is full";
        return -1;
    }
    if (!writable) {
        why = "block store " + path + " is read-only (a saved context references it)";
        return -1;
    }
    // blocks go only after the file's end: a store showing fewer blocks than its file holds (limit) or
    // one another process grew would otherwise overwrite blocks a saved context references
    struct stat st {};
    if (fstat(fd, &st) != 0 || (uint64_t) st.st_size != file_bytes()) {
        why = "block store " + path + " holds blocks after this reading's (another context's); it is not written";
        return -1;
    }
    const uint32_t H = shp.n_head_kv, bs = shp.block_size, dk = shp.d_k, dv = shp.d_v;
    const auto tk = (ggml_type) shp.k_type, tv = (ggml_type) shp.v_type;
    std::vector<uint8_t> buf(rec, 0);
    for (uint32_t l = 0; l < shp.n_layer; ++l) {
        std::fill(buf.begin(), buf.end(), 0);
        uint8_t * p = buf.data();
        memcpy(p, pos, 4ull*bs);
        p += 4ull*bs;
        memcpy(p, repr + (size_t) l*H*dk, 4ull*H*dk);
        p += 4ull*H*dk;
        // one row per (head, token); q8_0/q4_0 need no importance matrix (stored_type)
        p += ggml_quantize_chunk(tk, k + (size_t) l*H*bs*dk, p, 0, (int64_t) H*bs, dk, nullptr);
        ggml_quantize_chunk(tv, v + (size_t) l*H*bs*dv, p, 0, (int64_t) H*bs, dv, nullptr);
        if (!write_all(fd, buf.data(), rec, offset(l, nblk))) {
            why = errno_text("cannot write block store " + path);
            // a partial record would make the file unreadable: cut it back to whole blocks
            if (ftruncate(fd, (off_t) file_bytes()) != 0) {
                why += " (and could not cut it back)";
            }
            return -1;
        }
    }
    nblk++;
    return (int64_t) nblk - 1;
}

size_t kvpot_block_store::n_cached() const {
    size_t n = 0;
    for (const auto & c : caches) {
        n += c.entries().size();
    }
    return n;
}

uint64_t kvpot_block_store::hits() const {
    uint64_t n = 0;
    for (const auto & c : caches) {
        n += c.hits;
    }
    return n;
}

uint64_t kvpot_block_store::misses() const {
    uint64_t n = 0;
    for (const auto & c : caches) {
        n += c.misses;
    }
    return n;
}

bool kvpot_block_store::set_cache(kvpot_cache_rule rule, double decay, uint64_t seed, std::string & why) {
    if (rule < KVPOT_CACHE_RULE_FREQ || rule > KVPOT_CACHE_RULE_RANDOM) {
        why = "cache rule " + std::to_string((int) rule) + " is not freq (0), lru (1), fifo (2) or random (3)";
        return false;
    }
    if (!(decay >= 0.0 && decay <= 1.0)) { // NaN too
        why = "cache decay " + std::to_string(decay) + " is not within 0..1";
        return false;
    }
    cfg.rule  = rule;
    cfg.decay = decay;
    rng.seed(seed);
    for (auto & c : caches) {
        c.clear();
    }
    return true;
}

bool kvpot_block_store::check_block(uint32_t layer, uint32_t block, std::string & why) const {
    if (layer >= shp.n_layer || block >= nblk) {
        why = "block " + std::to_string(block) + " of layer " + std::to_string(layer) + " is not in the store ("
            + std::to_string(nblk) + " blocks, " + std::to_string(shp.n_layer) + " layers)";
        return false;
    }
    return true;
}

// one pread of the record: the page cache keeps the file, and nothing of it is mapped into this process
// (RSS stays at the caches plus a record, and a file cut short by another process is a read error here,
// not a SIGBUS on a mapped page)
bool kvpot_block_store::read_record(uint32_t layer, uint32_t block, uint8_t * dst, std::string & why) const {
    if (!read_all(fd, dst, rec, offset(layer, block))) {
        why = errno_text("cannot read block " + std::to_string(block) + " of block store " + path);
        return false;
    }
    return true;
}

const uint8_t * kvpot_block_store::record(uint32_t layer, uint32_t block, std::string & why) {
    if (!check_block(layer, block, why)) {
        return nullptr;
    }
    return caches[layer].get(block, rec, [&](uint8_t * dst) { return read_record(layer, block, dst, why); });
}

void kvpot_block_store::settle(uint32_t layer, const uint32_t * blocks, const float * attention, size_t n) {
    if (layer < shp.n_layer) {
        caches[layer].settle(blocks, attention, n, cfg, rng);
    }
}

bool kvpot_block_store::read(uint32_t layer, uint32_t block, int32_t * pos, float * repr, float * k, float * v,
                             std::string & why) {
    const uint8_t * r = record(layer, block, why);
    if (!r) {
        return false;
    }
    const size_t bs = shp.block_size;
    decode(r, pos, repr, k, bs*shp.d_k, v, bs*shp.d_v);
    settle(layer, &block, nullptr, 1); // a lookup of this block alone, which received no attention
    return true;
}

void kvpot_block_store::decode(const uint8_t * p, int32_t * pos, float * repr, float * k, size_t k_head_stride, float * v,
                               size_t v_head_stride) const {
    const size_t H = shp.n_head_kv, bs = shp.block_size, dk = shp.d_k, dv = shp.d_v;
    const auto tk = (ggml_type) shp.k_type, tv = (ggml_type) shp.v_type;
    if (pos) {
        memcpy(pos, p, 4*bs);
    }
    p += 4*bs;
    if (repr) {
        memcpy(repr, p, 4*H*dk);
    }
    p += 4*H*dk;
    // a head's rows are contiguous: one conversion per head for K and for V
    const size_t k_head = bs*ggml_row_size(tk, dk), v_head = bs*ggml_row_size(tv, dv);
    for (size_t h = 0; h < H && k; ++h) {
        ggml_get_type_traits(tk)->to_float(p + h*k_head, k + h*k_head_stride, (int64_t) (bs*dk));
    }
    p += H*k_head;
    for (size_t h = 0; h < H && v; ++h) {
        ggml_get_type_traits(tv)->to_float(p + h*v_head, v + h*v_head_stride, (int64_t) (bs*dv));
    }
}

bool kvpot_block_store::topk(uint32_t layer, const float * q, uint32_t k, int32_t * out, float * scores,
                             std::string & why) {
    if (layer >= shp.n_layer) {
        why = "layer " + std::to_string(layer) + " is not in the block store";
        return false;
    }
    if (!q || (k > 0 && !out)) {
        why = "query or output is NULL";
        return false;
    }
    if (k > nblk) {
        why = "cannot choose " + std::to_string(k) + " of " + std::to_string(nblk) + " blocks";
        return false;
    }
    const uint32_t H = shp.n_head_kv, dk = shp.d_k, bs = shp.block_size;
    // score in parts: each part reads SCORE_PART representatives (H*dk floats each) and keeps the
    // running top k. Every lookup reads one representative from each block, so this loop is what grows
    // with the input: a pread from the page cache costs 0.7-0.8 us a block, where a fault on a mapped page
    // and the madvise that gave it back (so RSS stayed flat) cost ~5 us, 0.25 s of a Gemma chunk's ~0.6 s
    // at 1M tokens (python -m kvpot.bench.store_cost; docs/benchmarks.md)
    std::vector<std::pair<float, int32_t>> best; // (score, block), kept sorted best first
    best.reserve((size_t) k + SCORE_PART);
    std::vector<float> repr((size_t) H*dk);
    for (uint32_t b0 = 0; b0 < nblk; b0 += SCORE_PART) {
        const uint32_t b1 = std::min(nblk, b0 + SCORE_PART);
        for (uint32_t b = b0; b < b1; ++b) {
            const uint64_t off = offset(layer, b) + 4ull*bs;
            if (!read_all(fd, repr.data(), 4ull*H*dk, off)) {
                why = errno_text("cannot read block store " + path);
                return false;
            }
            double s = 0.0;
            for (size_t i = 0; i < (size_t) H*dk; ++i) {
                s += (double) q[i]*repr[i];
            }
            if (scores) {
                scores[b] = (float) s;
            }
            best.emplace_back((float) s, (int32_t) b);
        }
        auto better = [](const std::pair<float, int32_t> & a, const std::pair<float, int32_t> & b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        };
        const size_t keep = std::min<size_t>(k, best.size());
        std::partial_sort(best.begin(), best.begin() + keep, best.end(), better);
        best.resize(keep);
    }
    for (uint32_t i = 0; i < k; ++i) {
        out[i] = best[i].second;
    }
    return true;
}

bool kvpot_block_store::limit(uint32_t n, std::string & why) {
    if (n > nblk) {
        why = "cannot show " + std::to_string(n) + " of " + std::to_string(nblk) + " blocks";
        return false;
    }
    nblk = n;
    for (auto & c : caches) {
        c.drop_from(n);
    }
    return true;
}

bool kvpot_block_store::sync(std::string & why) {
    if (fsync(fd) != 0) {
        why = errno_text("cannot flush block store " + path);
        return false;
    }
    return true;
}
