// hk_cuda/global_views.cuh -- global views gl<T, RANK> (the hk::gl ABI) and where a tile sits in one.
namespace hk {

template <class T, int RANK> struct gl {
    T* ptr;
    int shape[RANK];
    long long stride[RANK];
};

// Where a tile of ND dims at tile index idx... sits in a tensor: element offset of its origin from the
// leading dims, its first row/column, and whether the leading indices are in range.
template <int ND, class T, int RANK> struct origin {
    long long base;
    long long row0, col0;
    bool lead_ok;
    int nrows, ncols;
    long long rstride, cstride;
    template <class... I>
    HK_DEV origin(const gl<T, RANK>& g, int tr, int tc, I... idx) {
        static_assert(sizeof...(I) == RANK, "one index per tensor dimension");
        const int ix[RANK] = {idx...};
        base = 0;
        lead_ok = true;
#pragma unroll
        for (int dd = 0; dd < RANK - ND; ++dd) {
            lead_ok = lead_ok && ix[dd] >= 0 && ix[dd] < g.shape[dd];
            base += (long long)ix[dd] * g.stride[dd];
        }
        if constexpr (ND == 2) {
            row0 = (long long)ix[RANK - 2] * tr;
            nrows = g.shape[RANK - 2];
            rstride = g.stride[RANK - 2];
        } else {
            row0 = 0;
            nrows = 1;
            rstride = 0;
        }
        col0 = (long long)ix[RANK - 1] * tc;
        ncols = g.shape[RANK - 1];
        cstride = g.stride[RANK - 1];
    }
    HK_DEV bool row_ok(int r) const { return lead_ok && row0 + r >= 0 && row0 + r < nrows; }
    HK_DEV bool col_ok(int c) const { return col0 + c >= 0 && col0 + c < ncols; }
    HK_DEV T* at(const gl<T, RANK>& g, int r, int c) const {
        return g.ptr + (base + (row0 + r) * rstride + (col0 + c) * cstride);
    }
};

// global_to_scalar: element idx... (all in elements) of an int tensor, the same for every thread; an index
// outside the tensor reads `fill` and touches no memory.
template <class T, int RANK, class... I>
HK_DEV int load_scalar(const gl<T, RANK>& g, int fill, I... idx) {
    static_assert(sizeof...(I) == RANK, "one index per tensor dimension");
    const int ix[RANK] = {idx...};
    long long off = 0;
    bool ok = true;
#pragma unroll
    for (int dd = 0; dd < RANK; ++dd) {
        ok = ok && ix[dd] >= 0 && ix[dd] < g.shape[dd];
        off += (long long)ix[dd] * g.stride[dd];
    }
    return ok ? (int)g.ptr[off] : fill;
}

HK_DEV bool aligned(const void* p, int bytes) { return ((unsigned long long)p & (bytes - 1)) == 0; }

}  // namespace hk
