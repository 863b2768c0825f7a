// hk_core/types.h -- element types and bit casts, shared by every vendor library.
// Needs the vendor hooks: HK_CORE_FN and hk::hw::f2u / hk::hw::u2f (DEVICE_API.md).
namespace hk {

typedef unsigned int u32;
typedef unsigned long long u64;

// 16-bit and fp8 element types are storage structs; arithmetic happens in f32 (conversions.h)
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
struct fp8e4m3 { unsigned char bits; };
struct fp8e5m2 { unsigned char bits; };

template <class A, class B> struct same { static constexpr bool value = false; };
template <class A> struct same<A, A> { static constexpr bool value = true; };
template <class T> struct is_fp8 {
    static constexpr bool value = same<T, fp8e4m3>::value || same<T, fp8e5m2>::value;
};

HK_CORE_FN u32 f2u(float x) { return hw::f2u(x); }
HK_CORE_FN float u2f(u32 x) { return hw::u2f(x); }

}  // namespace hk
