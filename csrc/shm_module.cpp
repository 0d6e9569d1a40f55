// pybind11 bindings of the shared-memory fabric: the module hal.emulation.shm._shm. Tensors cross this
// boundary as raw addresses and counts (no torch headers at build time); every blocking call
// releases the GIL. C++ failures become the typed errors of hal/emulation/shm/errors.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "shm_comm.h"
#include "shm_reduce.h"

namespace py = pybind11;
using halshm::Comm;
using halshm::Config;
using halshm::ShmFailure;

static const char* error_class(halshm::FailKind kind) {
  switch (kind) {
    case halshm::kTimeout: return "ShmTimeoutError";
    case halshm::kPeerDied: return "ShmPeerDiedError";
    case halshm::kMismatch: return "ShmMismatchError";
    case halshm::kAborted: return "ShmAbortedError";
    case halshm::kSetup: return "ShmSetupError";
    case halshm::kUnsupported: return "ShmUnsupportedError";
  }
  return "ShmError";
}

PYBIND11_MODULE(_shm, m) {
  m.doc() = "Shared-memory intra-node collectives (see hal/emulation/shm/__init__.py for the Python side).";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ShmFailure& e) {
      py::object errors = py::module_::import("hal.emulation.shm.errors");
      py::object cls = errors.attr(error_class(e.kind));
      py::object exc = cls(py::str(e.what()), py::arg("rank") = e.rank < 0 ? py::object(py::none()) : py::int_(e.rank),
                           py::arg("op") = e.op.empty() ? py::object(py::none()) : py::str(e.op),
                           py::arg("seq") = e.seq < 0 ? py::object(py::none()) : py::int_(e.seq),
                           py::arg("peer") = e.peer < 0 ? py::object(py::none()) : py::int_(e.peer));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  py::class_<Config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("slot_bytes", &Config::slot_bytes)
      .def_readwrite("p2p_slot_bytes", &Config::p2p_slot_bytes)
      .def_readwrite("p2p_slots", &Config::p2p_slots)
      .def_readwrite("timeout_ms", &Config::timeout_ms)
      .def_readwrite("spin_ns", &Config::spin_ns)
      .def_readwrite("small_bytes", &Config::small_bytes);

  m.def("segment_size", &Comm::segment_size, py::arg("world"), py::arg("config"));
  m.def("unlink", &Comm::unlink, py::arg("name"), "shm_unlink the name (the mapping stays valid)");
  m.def("reduce_supported", &halshm::reduce_supported, py::arg("dtype"), py::arg("op"));
  m.def("reduce", [](uintptr_t dst, std::vector<uintptr_t> srcs, size_t count, int32_t dtype, int32_t op) {
        std::vector<const void*> s;
        for (uintptr_t a : srcs) s.push_back(reinterpret_cast<const void*>(a));
        halshm::reduce_n(reinterpret_cast<void*>(dst), nullptr, s.data(), int(s.size()), count, dtype, op);
      }, py::arg("dst"), py::arg("srcs"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::call_guard<py::gil_scoped_release>(), "Local reduction (the kernel the collectives use); for tests.");

  auto nogil = py::call_guard<py::gil_scoped_release>();
  py::class_<Comm>(m, "Comm")
      .def(py::init<const std::string&, bool, int, int, const Config&>(), py::arg("name"), py::arg("create"),
           py::arg("rank"), py::arg("world"), py::arg("config"), nogil)
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world", &Comm::world)
      .def_property_readonly("segment_bytes", &Comm::segment_bytes)
      .def("set_timeout_ms", &Comm::set_timeout_ms)
      .def("allreduce", &Comm::allreduce, py::arg("ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
           py::arg("seq"), nogil)
      .def("broadcast", &Comm::broadcast, py::arg("ptr"), py::arg("nbytes"), py::arg("root"), py::arg("dtype"),
           py::arg("seq"), nogil)
      .def("allgather", &Comm::allgather, py::arg("outs"), py::arg("inp"), py::arg("nbytes"), py::arg("dtype"),
           py::arg("seq"), nogil)
      .def("reduce_scatter", &Comm::reduce_scatter, py::arg("out"), py::arg("ins"), py::arg("count"),
           py::arg("dtype"), py::arg("op"), py::arg("seq"), nogil)
      .def("alltoall", &Comm::alltoall, py::arg("outs"), py::arg("out_bytes"), py::arg("ins"), py::arg("in_bytes"),
           py::arg("dtype"), py::arg("seq"), nogil)
      .def("barrier", &Comm::barrier, py::arg("seq"), nogil)
      .def("post_send", &Comm::post_send, py::arg("ptr"), py::arg("nbytes"), py::arg("dst"), py::arg("tag"), nogil)
      .def("post_recv", &Comm::post_recv, py::arg("ptr"), py::arg("nbytes"), py::arg("src"), py::arg("tag"), nogil)
      .def("wait", &Comm::wait, py::arg("id"), nogil)
      .def("test", &Comm::test, py::arg("id"))
      .def("abort", [](Comm& c, const std::string& msg) { c.abort(halshm::kAborted, msg); }, py::arg("reason"))
      .def_property_readonly("aborted", &Comm::aborted)
      .def("abort_reason", &Comm::abort_reason)
      .def("close", &Comm::close, nogil);
}
