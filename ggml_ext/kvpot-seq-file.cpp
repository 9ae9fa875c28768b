// Restore a sequence state straight from a file: llama_state_seq_set_data takes the whole state as
// one buffer, so a saved context's state (as large as the cache it fills: ~0.9 GB for a 32K-cell pot
// of a 1.5B model) would sit in memory beside the cache while it is restored. Here llama.cpp's own
// reader (the memory's state_read) is fed from the file in pieces of at most READ_PIECE bytes.
#include "kvpot.h"
#include "kvpot-barrier.h"

#include "llama-io.h"
#include "llama-memory.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define KVPOT_CAN_PREAD 1
#else
#define KVPOT_CAN_PREAD 0
#endif

namespace {

// what llama_state_seq_get_data writes before the memory's state (llama-context.cpp's io_magic);
// tests/test_context_stream.py checks it against a state the library writes
constexpr uint32_t SEQ_MAGIC = 0xaf143cd8;
constexpr size_t   READ_PIECE = 4u << 20;

#if KVPOT_CAN_PREAD
// llama_io_read_i over [offset, offset + size) of an open file descriptor; reading past the end throws,
// as llama.cpp's buffer reader does
class io_read_fd : public llama_io_read_i {
public:
    io_read_fd(int fd, int64_t offset, int64_t size) : fd(fd), at(offset), left(size) {}

    void read(void * dst, size_t size) override {
        if ((int64_t) size > left) {
            throw std::runtime_error("the saved sequence state ends early");
        }
        auto * p = (uint8_t *) dst;
        size_t done = 0;
        while (done < size) {
            const ssize_t n = pread(fd, p + done, size - done, (off_t) (at + (int64_t) done));
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                throw std::runtime_error(n < 0 ? std::string("cannot read the saved context: ") + std::strerror(errno)
                                               : std::string("the saved context ends early"));
            }
            done += (size_t) n;
        }
        at += (int64_t) size;
        left -= (int64_t) size;
        n_read += size;
    }

    void read_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        piece.resize(std::min(size, READ_PIECE));
        for (size_t done = 0; done < size;) {
            const size_t n = std::min(size - done, piece.size());
            read(piece.data(), n);
            ggml_backend_tensor_set(tensor, piece.data(), offset + done, n);
            done += n;
        }
    }

    size_t n_bytes() override { return n_read; }

private:
    int fd;
    int64_t at, left;
    size_t n_read = 0;
    std::vector<uint8_t> piece;
};
#endif

} // namespace

int64_t kvpot_state_seq_read_fd(llama_context * ctx, int32_t fd, int64_t offset, int64_t size, llama_seq_id seq_id) {
    if (!ctx || fd < 0 || offset < 0 || size < 8) {
        return kvpot_fail(KVPOT_ERR_ARG, "context, file or state range out of range");
    }
#if !KVPOT_CAN_PREAD
    return kvpot_fail(KVPOT_ERR_STATE, "reading a sequence state from a file is not available on this platform");
#else
    return kvpot_guarded<int64_t>([&]() -> int64_t {
        llama_memory_t mem = llama_get_memory(ctx);
        if (!mem) {
            return kvpot_fail(KVPOT_ERR_STATE, "the context has no memory to restore");
        }
        llama_synchronize(ctx);
        io_read_fd io(fd, offset, size);
        try {
            uint32_t magic = 0;
            llama_seq_id saved_seq = 0;
            io.read(&magic, sizeof(magic));
            if (magic != SEQ_MAGIC) {
                return kvpot_fail(KVPOT_ERR_ARG, "not a llama.cpp sequence state (bad magic)");
            }
            io.read(&saved_seq, sizeof(saved_seq));
            mem->state_read(io, seq_id, 0);
        } catch (const std::exception & e) {
            return kvpot_fail(KVPOT_ERR_ARG, std::string("the saved sequence state cannot be restored: ") + e.what());
        }
        if ((int64_t) io.n_bytes() != size) {
            return kvpot_fail(KVPOT_ERR_ARG, "the saved sequence state has " + std::to_string(size) + " bytes, llama.cpp read " +
                              std::to_string(io.n_bytes()));
        }
        return (int64_t) io.n_bytes();
    });
#endif
}
