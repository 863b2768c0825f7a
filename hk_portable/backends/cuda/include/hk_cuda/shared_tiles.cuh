// hk_cuda/shared_tiles.cuh -- shared tiles st<T, R, C> (128-byte column blocks or row-major, 16-byte
// chunks XOR-swizzled), staged buffers sbuf, and the library's scratch area past the kernel's buffers.
namespace hk {

HK_HD constexpr bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

template <class T, int R, int C> struct st {
    typedef T dtype;
    static constexpr int ROWS = R, COLS = C;
    static constexpr int ROWB = C * (int)sizeof(T), BYTES = R * ROWB;
    // BLOCKED (rows of whole 128-byte lines, R % 8 == 0): ROWB/128 column blocks of R x 128 bytes, each with
    // the 128-byte swizzle (16-byte chunk ^= row % 8). That is the canonical SWIZZLE_128B layout that wgmma
    // descriptors and TMA read and write (the tile base 1024-aligned), and ldmatrix/cp.async stay free of
    // bank conflicts. Otherwise: row-major, the chunk XORed with the 128-byte line index (SWZ 1) or, for
    // wider power-of-two rows, with the row (SWZ 2).
    static constexpr bool BLOCKED = ROWB % 128 == 0 && R % 8 == 0;
    static constexpr int SWZ = (is_pow2(ROWB) && ROWB >= 16 && BYTES % 128 == 0) ? (ROWB <= 128 ? 1 : 2) : 0;
    static constexpr bool CHUNKED = ROWB % 16 == 0;      // rows made of whole 16-byte chunks
    unsigned char* ptr;
    static HK_DEV int offset(int r, int c) {
        const int b = c * (int)sizeof(T);
        if constexpr (BLOCKED) return ((b >> 7) * R + r) * 128 + ((b & 127) ^ ((r & 7) << 4));
        int o = r * ROWB + b;
        if (SWZ == 1) o ^= ((o >> 7) & 7) << 4;
        if (SWZ == 2) o ^= (r & 7) << 4;
        return o;
    }
    HK_DEV T* at(int r, int c) const { return reinterpret_cast<T*>(ptr + offset(r, c)); }
};

template <class T, int R, int C, int S> struct sbuf {
    unsigned char* ptr;
    HK_DEV explicit sbuf(unsigned char* p) : ptr(p) {}
    HK_DEV st<T, R, C> stage(int s) const { return st<T, R, C>{ptr + s * st<T, R, C>::BYTES}; }
};

// The scratch area past the kernel's shared buffers (the cuda emitter reserves HK_SCRATCH_BYTES)
template <int OFFSET, int BYTES> HK_DEV unsigned char* scratch() {
    static_assert(OFFSET + BYTES <= HK_SCRATCH_BYTES, "cuda emitter reserved too little scratch shared memory");
    return smem_base() + HK_SCRATCH_OFFSET + OFFSET;
}

}  // namespace hk
