/* hk_portable's op replay: the host path of a `torch.ops.hk.*` call on a GPU in C++ (runtime/opfast.py builds
 * and loads it; where it cannot be built every call keeps the Python path).
 *
 * Why: a call's Python path (the wrapper's checks and plan lookup, the kernel's fast path, the compiled launcher)
 * costs 15-25 us of host time where torch's own ops cost 8-14 (docs/perf-notes.md, issue 35). Once a call
 * signature has run, what the Python path does for it is fixed: allocate the same outputs, pack the same parameter
 * buffers with this call's pointers, launch the same kernels. So the second call of a signature runs the Python
 * path once more while recording it (runtime/opfast.py: the launches, through the compiled launcher's record list;
 * the allocations, through a dispatch mode that also refuses any other torch op), and every later call replays it
 * here: outputs from torch's allocator, each recorded buffer with this call's pointers patched in, the tensor maps
 * encoded again where the pointers moved, the launches on the current stream.
 *
 * Two kernels per enabled op, both registered from here on the op Python defined:
 *   BackendSelect (below autograd, above the device): the replay; a signature without a plan redispatches to the
 *     device kernel (the Python implementation), recording it the second time the signature is seen.
 *   AutogradCUDA: a call needing no gradient goes below autograd in C++; one that needs a gradient goes to the
 *     Python Autograd kernel, registered on the Autograd alias and so also AutogradOther's (redispatched there).
 * A signature is everything the Python path reads of a call: each tensor's dtype, device, sizes, strides, data
 * alignment and aliasing; every other argument's value; the current device and stream; HK_BACKEND. The plan cache
 * is bounded per op; a use_backend() block anywhere turns replay off while it is open (set_bypass).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Dtype.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int ABI = 1;
constexpr size_t MAX_ENTRIES = 4096;        // signatures remembered per op (seen or planned)

/* The compiled launcher's C API (clauncher.c, HK_LAUNCHER_ABI 3). */
struct LauncherApi {
    int abi;
    Py_ssize_t (*size)(PyObject *launcher);
    Py_ssize_t (*tail_offset)(PyObject *launcher);
    void (*encode_tail)(PyObject *launcher, unsigned char *buf);
    int (*launch)(PyObject *launcher, unsigned char *buf, const unsigned g[3], void *stream);
};
const LauncherApi *g_api = nullptr;
PyTypeObject *g_launcher_type = nullptr;
std::atomic<int> g_bypass{0};               // open use_backend() blocks: no replay while > 0
std::atomic<uint64_t> g_replays{0}, g_records{0}, g_refusals{0};

/* A pointer word of a recorded buffer: this call's pointer of `source` (>= 0: the op's argument of that index;
 * < 0: allocation -1 - source) plus `delta` bytes. */
struct Slot {
    uint32_t off;
    int32_t source;
    int64_t delta;
};

struct Launch {
    PyObject *launcher;                     // a strong reference, dropped never (plans live as long as the process)
    std::vector<unsigned char> buf;
    unsigned grid[3];
    std::vector<Slot> slots;
    Py_ssize_t tail_off;                    // >= 0: the tensor maps, encoded again when the pointers moved
    std::mutex tail_mu;                     // guards the two below
    std::vector<unsigned char> last_prefix, last_tail;
};

struct Alloc {
    std::vector<int64_t> sizes, strides;
    c10::ScalarType dtype;
};

struct Output {                             // the op's result i: a view of allocation `alloc`
    int alloc;
    std::vector<int64_t> sizes, strides;
    int64_t offset;
    bool whole;                             // the allocation itself (no view to make)
};

struct Plan {
    c10::Device device{c10::kCPU};
    void *stream = nullptr;
    std::vector<Alloc> allocs;
    std::vector<Output> outputs;
    std::vector<std::unique_ptr<Launch>> launches;
    std::vector<PyObject *> keep;           // constant tables the launches point at (strong references, never dropped)
};

struct Entry {
    int seen = 0;
    bool refused = false;
    std::shared_ptr<Plan> plan;
};

struct OpState {
    std::string name;
    const c10::FunctionSchema *schema = nullptr;
    std::shared_mutex mu;
    std::unordered_map<std::string, Entry> entries;
};

std::mutex g_ops_mu;
std::vector<std::unique_ptr<OpState>> g_ops;                 // never shrinks: kernels hold raw pointers
std::vector<std::unique_ptr<torch::Library>> g_libraries;
std::vector<c10::DeviceType> g_devices{c10::DeviceType::CUDA};
std::vector<std::pair<std::string, c10::DispatchKey>> g_registered;   // (op, key) pairs holding a kernel of ours

/* The recording handshake with runtime/opfast.py: the kernel sets t_record before running the Python
 * implementation; the implementation's wrapper takes it (recording()), records, and leaves its plan (or none) in
 * t_plan through set_plan(). */
thread_local bool t_record = false;
thread_local std::shared_ptr<Plan> t_plan;
thread_local bool t_plan_set = false;

OpState *state_of(const c10::OperatorHandle &op) {
    const c10::FunctionSchema *schema = &op.schema();
    std::lock_guard<std::mutex> g(g_ops_mu);
    for (auto &s : g_ops)
        if (s->schema == schema) return s.get();
    return nullptr;
}

template <class T>
void put(std::string &key, const T &v) {
    key.append(reinterpret_cast<const char *>(&v), sizeof v);
}

bool served_device(c10::DeviceType t) {
    for (auto d : g_devices)
        if (d == t) return true;
    return false;
}

/* The call's signature into `key`; false when the call is not one replay serves (another device, a tensor list,
 * an argument of a kind the key cannot hold, the current device not the tensors'). */
bool make_key(const torch::jit::Stack &stack, size_t n, std::string &key, c10::Device &device) {
    const size_t first = stack.size() - n;
    bool have_device = false;
    std::vector<const void *> ptrs;
    key.reserve(256);
    for (size_t i = 0; i < n; i++) {
        const c10::IValue &v = stack[first + i];
        if (v.isTensor()) {
            const at::Tensor &t = v.toTensor();
            if (!t.defined()) return false;
            const c10::Device d = t.device();
            if (!served_device(d.type())) return false;
            // a sparse, nested or storage-less tensor: the Python path's checks name what is wrong with it
            if (t.layout() != c10::kStrided || t.is_nested() || !t.has_storage()) return false;
            if (!have_device) {
                device = d;
                have_device = true;
            } else if (d != device) {
                return false;
            }
            const void *p = t.data_ptr();
            uint8_t alias = 255, align = 0;
            for (size_t j = 0; j < ptrs.size(); j++)
                if (ptrs[j] == p) { alias = (uint8_t)j; break; }
            ptrs.push_back(p);
            const uintptr_t u = reinterpret_cast<uintptr_t>(p);
            while (align < 4 && !(u & (uintptr_t(1) << align))) align++;   // up to 16 bytes: what vector loads and TMA need
            key.push_back('T');
            put(key, (int8_t)t.scalar_type());
            put(key, (int16_t)d.index());
            put(key, alias);
            put(key, align);
            put(key, (int8_t)t.dim());
            for (int64_t s : t.sizes()) put(key, s);
            for (int64_t s : t.strides()) put(key, s);
        } else if (v.isNone()) {
            key.push_back('N');
        } else if (v.isBool()) {
            key.push_back(v.toBool() ? 'Y' : 'F');
        } else if (v.isInt()) {
            key.push_back('I');
            put(key, v.toInt());
        } else if (v.isDouble()) {
            key.push_back('D');
            put(key, v.toDouble());
        } else if (v.isString()) {
            const auto &s = v.toStringRef();
            key.push_back('S');
            put(key, (uint32_t)s.size());
            key.append(s);
        } else if (v.isIntList()) {
            key.push_back('L');
            auto l = v.toIntList();
            put(key, (uint32_t)l.size());
            for (int64_t x : l) put(key, x);
        } else {
            return false;
        }
    }
    if (!have_device) return false;
    const auto *impl = c10::impl::getDeviceGuardImpl(device.type());
    if (impl->getDevice() != device) return false;
    key.push_back('@');
    put(key, impl->getStream(device).id());
    const char *env = std::getenv("HK_BACKEND");
    if (env != nullptr) key.append(env);
    return true;
}

/* The recorded launches again with this call's pointers, then the outputs on the stack. */
void replay(const c10::OperatorHandle &op, Plan &plan, torch::jit::Stack *stack, size_t n) {
    const size_t first = stack->size() - n;
    std::vector<at::Tensor> allocs;
    allocs.reserve(plan.allocs.size());
    for (const Alloc &a : plan.allocs)
        allocs.push_back(at::empty_strided(a.sizes, a.strides, at::TensorOptions().dtype(a.dtype).device(plan.device)));
    std::vector<unsigned char> heap;
    alignas(64) unsigned char local[4096];
    for (auto &lp : plan.launches) {
        Launch &l = *lp;
        unsigned char *buf = local;
        if (l.buf.size() > sizeof local) {
            heap.resize(l.buf.size());
            buf = heap.data();
        }
        std::memcpy(buf, l.buf.data(), l.buf.size());
        for (const Slot &s : l.slots) {
            const void *base = s.source >= 0 ? (*stack)[first + s.source].toTensor().data_ptr()
                                             : allocs[-1 - s.source].data_ptr();
            const uint64_t p = reinterpret_cast<uint64_t>(base) + (uint64_t)s.delta;
            std::memcpy(buf + s.off, &p, 8);
        }
        if (l.tail_off >= 0) {
            std::lock_guard<std::mutex> g(l.tail_mu);
            const size_t t = (size_t)l.tail_off;
            if (l.last_prefix.size() == t && std::memcmp(l.last_prefix.data(), buf, t) == 0) {
                std::memcpy(buf + t, l.last_tail.data(), l.last_tail.size());
            } else {
                g_api->encode_tail(l.launcher, buf);
                l.last_prefix.assign(buf, buf + t);
                l.last_tail.assign(buf + t, buf + l.buf.size());
            }
        }
        const int rc = g_api->launch(l.launcher, buf, l.grid, plan.stream);
        TORCH_CHECK(rc == 0, op.schema().name(), ": a replayed kernel launch failed with driver status ", rc,
                    " (grid ", l.grid[0], "x", l.grid[1], "x", l.grid[2], "); HK_OP_REPLAY=0 runs the Python path, "
                    "which names the launch");
    }
    torch::jit::drop(*stack, n);
    for (const Output &o : plan.outputs) {
        if (o.whole) stack->emplace_back(allocs[o.alloc]);
        else stack->emplace_back(allocs[o.alloc].as_strided(o.sizes, o.strides, o.offset));
    }
    g_replays.fetch_add(1, std::memory_order_relaxed);
}

const c10::DispatchKeySet BELOW_BACKEND_SELECT(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

void backend_select_kernel(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
    const c10::DispatchKeySet below = ks & BELOW_BACKEND_SELECT;
    OpState *st = state_of(op);
    const size_t n = op.schema().arguments().size();
    std::string key;
    c10::Device device(c10::kCPU);
    if (st == nullptr || g_bypass.load(std::memory_order_relaxed) > 0 || !make_key(*stack, n, key, device)) {
        op.redispatchBoxed(below, stack);
        return;
    }
    std::shared_ptr<Plan> plan;
    bool record = false;
    {
        std::shared_lock<std::shared_mutex> g(st->mu);
        auto it = st->entries.find(key);
        if (it != st->entries.end()) {
            plan = it->second.plan;
            record = !plan && !it->second.refused && it->second.seen > 0;
        }
    }
    if (plan) {
        replay(op, *plan, stack, n);
        return;
    }
    if (!record) {
        {
            std::unique_lock<std::shared_mutex> g(st->mu);
            if (st->entries.size() < MAX_ENTRIES || st->entries.count(key)) st->entries[key].seen += 1;
        }
        op.redispatchBoxed(below, stack);
        return;
    }
    t_record = true;
    t_plan.reset();
    t_plan_set = false;
    try {
        op.redispatchBoxed(below, stack);
    } catch (...) {
        t_record = false;
        t_plan.reset();
        throw;
    }
    t_record = false;
    std::shared_ptr<Plan> made = std::move(t_plan);
    const bool answered = t_plan_set;
    t_plan_set = false;
    if (made && made->device != device) made.reset();
    std::unique_lock<std::shared_mutex> g(st->mu);
    Entry &e = st->entries[key];
    if (made) {
        e.plan = std::move(made);
        g_records.fetch_add(1, std::memory_order_relaxed);
    } else if (answered) {                  // the recording refused this signature: never again
        e.refused = true;
        g_refusals.fetch_add(1, std::memory_order_relaxed);
    }
}

const c10::DispatchKeySet ABOVE_AUTOGRAD_MASKED(c10::DispatchKeySet::FULL_AFTER,
                                                c10::DispatchKey::AutogradFunctionality);

void autograd_kernel(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
    const size_t n = op.schema().arguments().size();
    if (c10::GradMode::is_enabled()) {
        const size_t first = stack->size() - n;
        for (size_t i = 0; i < n; i++) {
            const c10::IValue &v = (*stack)[first + i];
            if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) {
                // the Python Autograd kernel (registered on the Autograd alias, so AutogradOther's entry too),
                // with the keys above this one masked off as every redispatch does (PythonDispatcher would
                // otherwise call the op again from the top)
                op.redispatchBoxed((ks & ABOVE_AUTOGRAD_MASKED).add(c10::DispatchKey::AutogradOther), stack);
                return;
            }
        }
    }
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

/* ----------------------------------------------------------------------------------- Python API */
bool as_i64_tuple(PyObject *o, std::vector<int64_t> &out) {
    if (!PyTuple_Check(o)) return false;
    out.clear();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(o, i));
        if (v == -1 && PyErr_Occurred()) return false;
        out.push_back(v);
    }
    return true;
}

bool as_dtype(PyObject *o, c10::ScalarType &out) {
    if (!THPDtype_Check(o)) return false;
    out = reinterpret_cast<THPDtype *>(o)->scalar_type;
    return true;
}

PyObject *bad_plan(const char *why) {
    PyErr_Format(PyExc_ValueError, "opfast.set_plan: %s", why);
    return nullptr;
}

/* set_plan(None | (device, stream, allocs, outputs, launches, keep)): device as torch names it ("cuda:0"); keep: the
 *   constant tables (runtime/opfast.constant) recorded pointers lie in, held as long as the plan;
 *   allocs: ((sizes, strides, dtype), ...); outputs: ((alloc, sizes, strides, offset, whole), ...);
 *   launches: ((launcher, buffer bytes, (gx, gy, gz), ((offset, source, delta), ...)), ...). */
PyObject *set_plan(PyObject *, PyObject *spec) {
    if (spec == Py_None) {
        t_plan.reset();
        t_plan_set = true;
        Py_RETURN_NONE;
    }
    const char *device;
    unsigned long long stream;
    PyObject *allocs, *outputs, *launches, *keep;
    if (!PyArg_ParseTuple(spec, "sKO!O!O!O!", &device, &stream, &PyTuple_Type, &allocs, &PyTuple_Type, &outputs,
                          &PyTuple_Type, &launches, &PyTuple_Type, &keep))
        return nullptr;
    auto plan = std::make_shared<Plan>();
    try {
        plan->device = c10::Device(device);
    } catch (const std::exception &e) {
        return bad_plan("the device is not one torch names");
    }
    plan->stream = reinterpret_cast<void *>((uintptr_t)stream);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(allocs); i++) {
        PyObject *sizes, *strides, *dtype;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(allocs, i), "OOO", &sizes, &strides, &dtype)) return nullptr;
        Alloc a;
        if (!as_i64_tuple(sizes, a.sizes) || !as_i64_tuple(strides, a.strides) || a.sizes.size() != a.strides.size() ||
            !as_dtype(dtype, a.dtype))
            return bad_plan("an allocation is (sizes, strides, dtype)");
        plan->allocs.push_back(std::move(a));
    }
    const Py_ssize_t nallocs = PyTuple_GET_SIZE(allocs);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outputs); i++) {
        PyObject *sizes, *strides;
        long long offset;
        int alloc, whole;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outputs, i), "iOOLp", &alloc, &sizes, &strides, &offset, &whole))
            return nullptr;
        Output o{alloc, {}, {}, offset, whole != 0};
        if (alloc < 0 || alloc >= nallocs || !as_i64_tuple(sizes, o.sizes) || !as_i64_tuple(strides, o.strides))
            return bad_plan("an output is (allocation index, sizes, strides, offset, whole)");
        plan->outputs.push_back(std::move(o));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); i++) {
        PyObject *launcher, *slots;
        const char *bytes;
        Py_ssize_t nbytes;
        auto l = std::make_unique<Launch>();
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(launches, i), "Oy#(III)O!", &launcher, &bytes, &nbytes, &l->grid[0],
                              &l->grid[1], &l->grid[2], &PyTuple_Type, &slots))
            return nullptr;
        if (g_launcher_type == nullptr || !PyObject_TypeCheck(launcher, g_launcher_type))
            return bad_plan("a launch's first item must be a compiled Launcher");
        if (nbytes != g_api->size(launcher)) return bad_plan("a buffer is not its launcher's size");
        l->buf.assign(bytes, bytes + nbytes);
        l->tail_off = g_api->tail_offset(launcher);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(slots); k++) {
            unsigned long off;
            int source;
            long long delta;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(slots, k), "kiL", &off, &source, &delta)) return nullptr;
            if (off + 8 > (unsigned long)nbytes || (l->tail_off >= 0 && off + 8 > (unsigned long)l->tail_off) ||
                source < -nallocs)
                return bad_plan("a pointer slot lies outside its buffer's parameters or names no source");
            l->slots.push_back(Slot{(uint32_t)off, source, delta});
        }
        Py_INCREF(launcher);
        l->launcher = launcher;
        plan->launches.push_back(std::move(l));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keep); i++) {
        PyObject *t = PyTuple_GET_ITEM(keep, i);
        Py_INCREF(t);
        plan->keep.push_back(t);
    }
    t_plan = std::move(plan);
    t_plan_set = true;
    Py_RETURN_NONE;
}

/* recording() -> bool: whether this call of the implementation is to record (true once per recording) */
PyObject *recording(PyObject *, PyObject *) {
    const bool r = t_record;
    t_record = false;
    return PyBool_FromLong(r);
}

c10::DispatchKey autograd_key(c10::DeviceType t) {
    return t == c10::DeviceType::CPU ? c10::DispatchKey::AutogradCPU : c10::DispatchKey::AutogradCUDA;
}

/* Our kernel for hk::name under `key`, once (call with g_ops_mu held). */
void register_kernel(const std::string &name, c10::DispatchKey key) {
    for (auto &r : g_registered)
        if (r.first == name && r.second == key) return;
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "hk", key, __FILE__, __LINE__);
    if (key == c10::DispatchKey::BackendSelect)
        lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&backend_select_kernel>());
    else
        lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&autograd_kernel>());
    g_libraries.push_back(std::move(lib));
    g_registered.emplace_back(name, key);
}

/* enable(name): replay for hk::name (the op must be defined) */
PyObject *enable(PyObject *, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == nullptr) return nullptr;
    try {
        auto handle = c10::Dispatcher::singleton().findSchema({std::string("hk::") + name, ""});
        if (!handle) {
            PyErr_Format(PyExc_ValueError, "opfast.enable: no op hk::%s", name);
            return nullptr;
        }
        std::lock_guard<std::mutex> g(g_ops_mu);
        bool known = false;
        for (auto &st : g_ops) known = known || st->schema == &handle->schema();
        if (!known) {
            auto st = std::make_unique<OpState>();
            st->name = name;
            st->schema = &handle->schema();
            g_ops.push_back(std::move(st));
        }
        register_kernel(name, c10::DispatchKey::BackendSelect);
        for (auto d : g_devices) register_kernel(name, autograd_key(d));
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "opfast.enable(%s): %s", name, e.what());
        return nullptr;
    }
    Py_RETURN_NONE;
}

/* configure(launcher_type, capsule): the compiled launcher this module replays through */
PyObject *configure(PyObject *, PyObject *args) {
    PyObject *type, *capsule;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &capsule)) return nullptr;
    auto *api = static_cast<const LauncherApi *>(PyCapsule_GetPointer(capsule, "hk_portable._hk_launcher._C_API"));
    if (api == nullptr) return nullptr;
    if (api->abi != 3) return PyErr_Format(PyExc_RuntimeError, "opfast: launcher ABI %d, expected 3", api->abi);
    Py_INCREF(type);
    g_launcher_type = reinterpret_cast<PyTypeObject *>(type);
    g_api = api;
    Py_RETURN_NONE;
}

/* serve_devices(names): the device types replay serves ("cuda"; tests add "cpu" with a fake driver). A kernel
 * registered for a device's autograd key stays (it behaves as the Python one when its device is not served). */
PyObject *serve_devices(PyObject *, PyObject *names) {
    PyObject *seq = PySequence_Fast(names, "serve_devices: a sequence of device type names");
    if (seq == nullptr) return nullptr;
    std::vector<c10::DeviceType> out;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
        if (s == nullptr) { Py_DECREF(seq); return nullptr; }
        try {
            out.push_back(c10::Device(s).type());
        } catch (const std::exception &e) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "serve_devices: %s", e.what());
        }
    }
    Py_DECREF(seq);
    std::lock_guard<std::mutex> g(g_ops_mu);
    try {
        for (auto d : out)
            for (auto &st : g_ops) register_kernel(st->name, autograd_key(d));
    } catch (const std::exception &e) {
        return PyErr_Format(PyExc_RuntimeError, "serve_devices: %s", e.what());
    }
    g_devices = std::move(out);
    Py_RETURN_NONE;
}

PyObject *set_bypass(PyObject *, PyObject *delta) {
    long d = PyLong_AsLong(delta);
    if (d == -1 && PyErr_Occurred()) return nullptr;
    g_bypass.fetch_add((int)d);
    Py_RETURN_NONE;
}

/* clear(): forget every plan and signature (tests; plans' launchers stay referenced) */
PyObject *clear(PyObject *, PyObject *) {
    std::lock_guard<std::mutex> g(g_ops_mu);
    for (auto &s : g_ops) {
        std::unique_lock<std::shared_mutex> w(s->mu);
        s->entries.clear();
    }
    Py_RETURN_NONE;
}

/* stats() -> {"replays", "records", "refusals", "plans": {op: n}} */
PyObject *stats(PyObject *, PyObject *) {
    PyObject *plans = PyDict_New();
    if (plans == nullptr) return nullptr;
    {
        std::lock_guard<std::mutex> g(g_ops_mu);
        for (auto &s : g_ops) {
            std::shared_lock<std::shared_mutex> r(s->mu);
            long n = 0;
            for (auto &kv : s->entries) n += kv.second.plan ? 1 : 0;
            PyObject *v = PyLong_FromLong(n);
            if (v == nullptr || PyDict_SetItemString(plans, s->name.c_str(), v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(plans);
                return nullptr;
            }
            Py_DECREF(v);
        }
    }
    return Py_BuildValue("{sKsKsKsN}", "replays", (unsigned long long)g_replays.load(), "records",
                         (unsigned long long)g_records.load(), "refusals", (unsigned long long)g_refusals.load(),
                         "plans", plans);
}

PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(Launcher type, the launcher's _C_API capsule)"},
    {"enable", enable, METH_O, "enable(name): replay hk::name's calls"},
    {"recording", recording, METH_NOARGS, "whether this implementation call records (once)"},
    {"set_plan", set_plan, METH_O, "set_plan(plan | None): the recording's result"},
    {"serve_devices", serve_devices, METH_O, "serve_devices(names): the device types replayed"},
    {"set_bypass", set_bypass, METH_O, "set_bypass(+1 | -1): a use_backend() block opened or closed"},
    {"clear", clear, METH_NOARGS, "forget every plan"},
    {"stats", stats, METH_NOARGS, "counters and plans per op"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_hk_opfast", "hk_portable's op replay (runtime/opfast.py)", -1,
                          methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__hk_opfast(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == nullptr) return nullptr;
    if (PyModule_AddIntConstant(m, "ABI", ABI) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
