"""``OrtRuntime``: the ONNX Runtime implementation of :class:`~.runtime.Runtime` (``docs/sam2-backend.md`` §0, §6).

Memory lives where the execution provider computes: NumPy arrays on CPU, ORT-allocated CUDA memory for the CUDA and
TensorRT providers.  Every allocation is one flat byte block; a :class:`DeviceBuffer` is a typed window into it, so a
slot of the memory bank is just ``base + offset``.  Graphs are driven through one reused ``IOBinding`` per graph with
*pointer* bindings (``bind_input``/``bind_output`` with ``buffer_ptr``) on every device, so ORT reads inputs in place
and writes outputs straight into our memory -- including interior slot views -- and the CPU tests exercise the same
binding code the GPU path runs.  A binding is only re-issued when the buffer bound to that name changed since the last
run, which keeps the per-run overhead near that of a pre-bound ``IOBinding``.

After each run the runtime checks that ORT really wrote into the bound memory (it compares the output data pointers);
if it ever did not, the result is copied into the buffer, counted as device-to-device traffic and recorded in
:attr:`OrtRuntime.inplace_fallbacks`.  Host<->device traffic is counted in :meth:`upload`/:meth:`download` on every
device, CPU included, so the session's accounting is identical on every runtime.

``onnxruntime`` is imported lazily (``pip install 'vostream[onnx]'``; ``onnxruntime-gpu`` for CUDA / TensorRT).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.backends.binding import Allocation, BindingRuntime, fmt_shape
from vostream.stages.trackers.sam2.runtime import DTYPES, DeviceBuffer

if TYPE_CHECKING:
    # onnxruntime is optional and untyped here (pyproject: follow_imports = "skip"): these names document
    from onnxruntime import InferenceSession, IOBinding, OrtValue, SessionOptions

    from vostream.stages.trackers.sam2.manifest import GraphSpec, Manifest, TensorSpec

CPU_EP = "CPUExecutionProvider"
CUDA_EP = "CUDAExecutionProvider"
TRT_EP = "TensorrtExecutionProvider"

#: short provider names accepted by :class:`OrtRuntime` -> the provider list they expand to
SHORT_PROVIDERS: dict[str, tuple[str, ...]] = {
    "cpu": (CPU_EP,),
    "cuda": (CUDA_EP, CPU_EP),
    "tensorrt": (TRT_EP, CUDA_EP, CPU_EP),
    "trt": (TRT_EP, CUDA_EP, CPU_EP),
}
#: providers whose memory is CUDA device memory (everything else is bound as host memory)
_CUDA_MEMORY_EPS = (CUDA_EP, TRT_EP)

#: ONNX Runtime type strings -> our dtype names (unsupported ones keep a readable name for error messages)
_ORT_TYPES: dict[str, str] = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
    "tensor(double)": "float64",
    "tensor(bfloat16)": "bfloat16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(string)": "string",
}

_ALIGN = 64


def _import_ort() -> ModuleType:
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendError(
            "OrtRuntime: onnxruntime is not installed; install it with pip install 'vostream[onnx]' "
            "(or onnxruntime-gpu for CUDA / TensorRT)"
        ) from exc
    return onnxruntime


@dataclass
class _Alloc(Allocation):
    """One allocation: ``nbytes`` at address ``ptr``; ``host`` (CPU) or ``dev`` (a CUDA ``OrtValue``) owns it."""

    host: np.ndarray | None = None
    dev: OrtValue | None = None


@dataclass
class _Graph:
    """A loaded graph: its session, its reused IOBinding and what is currently bound to it."""

    spec: GraphSpec
    path: Path
    session: InferenceSession
    binding: IOBinding
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    bound: dict[tuple[str, str], tuple[int, int, tuple[int, ...]]] = field(default_factory=dict)
    out_order: list[str] = field(default_factory=list)  # binding order of outputs = order of get_outputs()


class _CudaRT:
    """The few CUDA runtime calls needed to copy to/from a *window* of a device allocation (ctypes, no extra deps).

    Whole-buffer copies go through ORT itself (``OrtValue.update_inplace`` / ``.numpy()``); ORT has no Python API
    to copy into the middle of an allocation, so windows use ``cudaMemcpy``.  ``libcudart`` is normally already loaded
    into the process by ORT's CUDA provider; otherwise ORT's ``preload_dlls`` and the ``nvidia-cuda-runtime`` wheel are
    tried.
    """

    H2D, D2H, D2D = 1, 2, 3

    def __init__(self, ort: ModuleType, device_id: int) -> None:
        self.device_id = device_id
        lib = self._find(ort)
        for fn in ("cudaMemcpy",):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        self.lib = lib

    @staticmethod
    def _find(ort: ModuleType) -> ctypes.CDLL:
        names = (
            ("cudart64_12.dll", "cudart64_13.dll", "cudart64_110.dll")
            if sys.platform == "win32"
            else ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so")
        )

        def attempt() -> ctypes.CDLL | None:
            for n in names:
                try:
                    return ctypes.CDLL(n)
                except OSError:
                    continue
            for root in sys.path:
                for cand in sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libcudart.so*"))):
                    try:
                        return ctypes.CDLL(cand)
                    except OSError:
                        continue
            return None

        lib = attempt()
        if lib is None and hasattr(ort, "preload_dlls"):
            with contextlib.suppress(Exception):  # best effort; the error below explains what is missing
                ort.preload_dlls(cuda=True, cudnn=False, msvc=False)
            lib = attempt()
        if lib is None:
            raise BackendError(
                "OrtRuntime: copying to/from part of a CUDA buffer needs the CUDA runtime library "
                f"(tried {', '.join(names)}); install the CUDA runtime matching onnxruntime-gpu"
            )
        return lib

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            raise BackendError(f"OrtRuntime.{what}: CUDA error {rc}: {msg.decode() if msg else '?'}")

    def copy(self, dst: int, src: int, nbytes: int, kind: int, what: str) -> None:
        """Synchronous copy; the device is synchronised around it because ORT computes on its own stream."""
        self._check(self.lib.cudaSetDevice(self.device_id), what)
        self._check(self.lib.cudaDeviceSynchronize(), what)
        self._check(self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind), what)
        self._check(self.lib.cudaDeviceSynchronize(), what)


class OrtRuntime(BindingRuntime[_Alloc]):
    """ONNX Runtime on CPU, CUDA or TensorRT.  One device, one driving thread; not thread-safe.

    ``providers``: ONNX Runtime provider names or the short names ``cpu``, ``cuda``, ``tensorrt`` (TensorRT, CUDA,
    CPU); entries may also be ``(name, options)`` pairs, passed to ORT as they are.  ``threads``: intra-op threads
    (``None``: ORT's default).  ``session_options``: an ``onnxruntime.SessionOptions`` used instead of the default one
    (graph optimisation level ALL); ``threads`` is still applied to it when given.  ``trt_fp16`` and
    ``trt_cache_dir`` configure the TensorRT provider (fp16 off by default; engines cached in that directory).
    """

    name = "OrtRuntime"

    def __init__(
        self,
        providers: Sequence[str | tuple[str, dict[str, object]]] | str | None = None,
        device_id: int = 0,
        threads: int | None = None,
        session_options: SessionOptions | None = None,
        *,
        trt_fp16: bool = False,
        trt_cache_dir: str | Path | None = None,
    ) -> None:
        super().__init__()
        self._ort = _import_ort()
        self.device_id = int(device_id)
        self.threads = threads
        self._providers = self._resolve_providers(providers, trt_fp16, trt_cache_dir)
        names = [p if isinstance(p, str) else p[0] for p in self._providers]
        self._primary = names[0]
        self._device_type = "cuda" if self._primary in _CUDA_MEMORY_EPS else "cpu"
        # shorter memory-attention views each frame: free on CPU and CUDA; TensorRT would build an engine per shape
        self.dynamic_shapes = self._primary != "TensorrtExecutionProvider"
        if session_options is None:
            session_options = self._ort.SessionOptions()
            session_options.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            # the tracker shares the cores with decode/preprocess/postprocess threads: idle ORT workers must sleep,
            # not spin (spinning workers starve the other pipeline stages on small machines)
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session_options.log_severity_level = (
                3  # ORT's own warnings (shape-merge notes) are not actionable
            )
        if threads is not None:
            if threads < 1:
                raise BackendError(f"OrtRuntime: threads must be >= 1 (got {threads})")
            session_options.intra_op_num_threads = int(threads)
        self._so = session_options
        self._graphs: dict[str, _Graph] = {}
        self._cudart: _CudaRT | None = None
        self._closed = False
        #: ``"graph/output" -> count`` of runs where ORT did not write into the bound buffer and a copy was needed
        self.inplace_fallbacks: dict[str, int] = {}

    # -- construction ------------------------------------------------------------------------------------------------
    def _resolve_providers(
        self,
        providers: Sequence[str | tuple[str, dict[str, object]]] | str | None,
        trt_fp16: bool,
        trt_cache_dir: str | Path | None,
    ) -> list[str | tuple[str, dict[str, object]]]:
        """Expand short names, add default options, drop duplicates, and refuse providers this ORT build lacks."""
        if providers is None:
            providers = [CPU_EP]
        elif isinstance(providers, str):
            providers = [providers]
        if not providers:
            raise BackendError("OrtRuntime: empty provider list")
        expanded: list[str | tuple[str, dict[str, object]]] = []
        for p in providers:
            if isinstance(p, str):
                expanded.extend(SHORT_PROVIDERS.get(p.lower(), (p,)))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
                expanded.append((p[0], dict(p[1])))
            else:
                raise BackendError(
                    f"OrtRuntime: provider entry {p!r} is neither a name nor a (name, options) pair"
                )
        available = list(self._ort.get_available_providers())
        out: list[str | tuple[str, dict[str, object]]] = []
        seen: set[str] = set()
        for p in expanded:
            pname = p if isinstance(p, str) else p[0]
            if pname in seen:
                continue
            seen.add(pname)
            if pname not in available:
                hint = (
                    "install the GPU build: pip uninstall onnxruntime && pip install onnxruntime-gpu "
                    "(TensorRT also needs the TensorRT libraries)"
                    if pname in _CUDA_MEMORY_EPS
                    else "install an onnxruntime build that includes it"
                )
                raise BackendError(
                    f"OrtRuntime: execution provider {pname} is not available in onnxruntime "
                    f"{self._ort.__version__} (available: {', '.join(available)}); {hint}"
                )
            if isinstance(p, str):
                if pname == CUDA_EP:
                    p = (pname, {"device_id": self.device_id})
                elif pname == TRT_EP:
                    opts: dict[str, object] = {"device_id": self.device_id, "trt_fp16_enable": bool(trt_fp16)}
                    if trt_cache_dir is not None:
                        Path(trt_cache_dir).mkdir(parents=True, exist_ok=True)
                        opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(trt_cache_dir))
                    p = (pname, opts)
            out.append(p)
        return out

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise BackendError(f"OrtRuntime.{call}: runtime is closed")

    # -- graphs ------------------------------------------------------------------------------------------------------
    def load(self, manifest: Manifest, model_dir: Path) -> None:
        """Open one ``InferenceSession`` per graph and check its I/O names, dtypes and static dims against the
        manifest.  All graphs load or none do (a failure leaves previously loaded graphs in place)."""
        self._check_open("load")
        model_dir = Path(model_dir)
        loaded: dict[str, _Graph] = {}
        for gname, spec in manifest.graphs.items():
            spec = spec.with_shrinkable_axes()  # ORT takes any size there: sessions may bind shorter views
            path = model_dir / spec.file
            if not path.is_file():
                raise BackendError(
                    f"OrtRuntime.load: graph {gname!r}: model file {path} not found "
                    f"(provider {self._primary})"
                )
            try:
                sess = self._ort.InferenceSession(str(path), sess_options=self._so, providers=self._providers)
            except Exception as exc:
                raise BackendError(
                    f"OrtRuntime.load: graph {gname!r}: cannot load {path} with {self._primary}: {exc}"
                ) from exc
            active = list(sess.get_providers())
            if self._primary not in active:
                raise BackendError(
                    f"OrtRuntime.load: graph {gname!r}: {path} was requested on {self._primary} but "
                    f"onnxruntime put it on {', '.join(active)} (the provider failed to initialise; "
                    "check the CUDA / cuDNN / TensorRT libraries match onnxruntime-gpu)"
                )
            self._check_io(gname, spec, path, sess)
            loaded[gname] = _Graph(
                spec,
                path,
                sess,
                sess.io_binding(),
                {t.name: t for t in spec.inputs},
                {t.name: t for t in spec.outputs},
            )
        self._graphs = loaded

    @staticmethod
    def _check_io(gname: str, spec: GraphSpec, path: Path, sess: InferenceSession) -> None:
        """Raise ``BackendError`` naming graph, tensor and both values where the model and the manifest disagree."""
        for kind, want, got in (
            ("input", spec.inputs, sess.get_inputs()),
            ("output", spec.outputs, sess.get_outputs()),
        ):
            model = {n.name: n for n in got}
            names = [t.name for t in want]
            for t in want:
                if t.name not in model:
                    raise BackendError(
                        f"OrtRuntime.load: graph {gname!r} ({path.name}): {kind} {t.name!r} is in the "
                        f"manifest but not in the model (model {kind}s: {', '.join(model) or 'none'})"
                    )
            for n in model:
                if n not in names:
                    raise BackendError(
                        f"OrtRuntime.load: graph {gname!r} ({path.name}): model {kind} {n!r} is not in "
                        f"the manifest (manifest {kind}s: {', '.join(names) or 'none'})"
                    )
            for t in want:
                m = model[t.name]
                mdtype = _ORT_TYPES.get(m.type, m.type)
                if mdtype != t.dtype:
                    raise BackendError(
                        f"OrtRuntime.load: graph {gname!r} ({path.name}): {kind} {t.name!r} dtype: "
                        f"manifest {t.dtype}, model {mdtype}"
                    )
                mshape = list(m.shape)
                bad = len(mshape) != len(t.shape)
                for a, b in zip(t.shape, mshape):
                    # manifest static vs model static must agree; manifest dynamic needs a dynamic model axis
                    # (a model-dynamic axis the manifest pins is fine: the manifest is what run() enforces)
                    if isinstance(b, int) and (isinstance(a, str) or a != b):
                        bad = True
                if bad:
                    raise BackendError(
                        f"OrtRuntime.load: graph {gname!r} ({path.name}): {kind} {t.name!r} shape: "
                        f"manifest {fmt_shape(t.shape)}, model {fmt_shape(mshape)}"
                    )

    @property
    def providers_in_use(self) -> dict[str, list[str]]:
        """``graph -> providers its session actually runs on`` (ORT's own list, most preferred first)."""
        self._check_open("providers_in_use")
        return {n: list(g.session.get_providers()) for n, g in self._graphs.items()}

    def describe(self) -> str:
        """One line for logs: ORT version, providers, device, threads, graphs and live memory."""
        names = [p if isinstance(p, str) else p[0] for p in self._providers]
        live = sum(a.nbytes for a in self._allocs.values())
        state = (
            "closed"
            if self._closed
            else f"{len(self._graphs)} graphs, {len(self._allocs)} buffers ({live / 2**20:.1f} MiB)"
        )
        return (
            f"OrtRuntime(onnxruntime {self._ort.__version__}, providers {'>'.join(names)}, "
            f"memory {self._device_type}:{self.device_id}, threads {self.threads or 'default'}, {state})"
        )

    # -- memory ------------------------------------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: str, name: str = "") -> DeviceBuffer:
        """A zero-filled buffer: a 64-byte-aligned NumPy byte block on CPU, an ORT CUDA allocation on CUDA."""
        self._check_open("alloc")
        shape, nbytes = self._alloc_args(shape, dtype, name)
        if self._device_type == "cpu":
            raw = np.zeros(nbytes + _ALIGN, np.uint8)
            start = -raw.ctypes.data % _ALIGN
            host = raw[start : start + nbytes]
            return self._register(_Alloc(host.ctypes.data, nbytes, name, host=host), shape, dtype, name)
        try:
            ov = self._ort.OrtValue.ortvalue_from_numpy(
                np.zeros(max(nbytes, 1), np.uint8), "cuda", self.device_id
            )
        except Exception as exc:
            raise BackendError(
                f"OrtRuntime.alloc({name or '?'}): cannot allocate {nbytes} bytes on "
                f"cuda:{self.device_id}: {exc}"
            ) from exc
        return self._register(_Alloc(int(ov.data_ptr()), nbytes, name, dev=ov), shape, dtype, name)

    def view(self, buf: DeviceBuffer, offset_elems: int, shape: tuple[int, ...]) -> DeviceBuffer:
        """A window into ``buf`` (no copy); see :meth:`Runtime.view`."""
        self._check_open("view")
        return super().view(buf, offset_elems, shape)

    def _host_window(self, a: _Alloc, buf: DeviceBuffer) -> np.ndarray:
        assert a.host is not None
        return a.host[buf.offset : buf.offset + buf.nbytes].view(DTYPES[buf.dtype]).reshape(buf.shape)

    def _cuda(self) -> _CudaRT:
        if self._cudart is None:
            self._cudart = _CudaRT(self._ort, self.device_id)
        return self._cudart

    def upload(self, dst: DeviceBuffer, src: np.ndarray) -> None:
        """Copy ``src`` (same dtype and number of elements as ``dst``) host -> device; counted in ``stats``."""
        self._check_open("upload")
        a = self._alloc_of(dst, "upload")
        src = self._upload_source(dst, src)
        if a.host is not None:
            np.copyto(self._host_window(a, dst), src.reshape(dst.shape))
        elif dst.nbytes:
            assert a.dev is not None  # no host array: a device allocation
            flat = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
            try:
                if dst.offset == 0 and dst.nbytes == a.nbytes:
                    a.dev.update_inplace(flat)
                else:
                    self._cuda().copy(a.ptr + dst.offset, flat.ctypes.data, dst.nbytes, _CudaRT.H2D, "upload")
            except BackendError:
                raise
            except Exception as exc:
                raise BackendError(f"OrtRuntime.upload({dst.name or dst.handle}): {exc}") from exc
        self._count_h2d(dst.nbytes)

    def download(self, src: DeviceBuffer, out: np.ndarray | None = None) -> np.ndarray:
        """Copy device -> host into ``out`` (or a new array) shaped ``src.shape``; counted in ``stats``."""
        self._check_open("download")
        a = self._alloc_of(src, "download")
        dt = DTYPES[src.dtype]
        out = self._download_target(src, out)
        if a.host is not None:
            np.copyto(out, self._host_window(a, src))
        elif src.nbytes:
            assert a.dev is not None  # no host array: a device allocation
            try:
                if src.offset == 0 and src.nbytes == a.nbytes:
                    np.copyto(out, a.dev.numpy().view(dt).reshape(src.shape))
                else:
                    self._cuda().copy(
                        out.ctypes.data, a.ptr + src.offset, src.nbytes, _CudaRT.D2H, "download"
                    )
            except BackendError:
                raise
            except Exception as exc:
                raise BackendError(f"OrtRuntime.download({src.name or src.handle}): {exc}") from exc
        self._count_d2h(src.nbytes)
        return out

    def free(self, buf: DeviceBuffer) -> None:
        """Release the allocation behind ``buf`` (any view of it); views of it become invalid."""
        self._check_open("free")
        self._forget(buf)

    def close(self) -> None:
        """Free every buffer and drop the sessions and bindings.  Idempotent."""
        if self._closed:
            return
        for g in self._graphs.values():
            g.binding.clear_binding_inputs()
            g.binding.clear_binding_outputs()
        self._graphs.clear()
        self._allocs.clear()
        self._closed = True

    # -- running -----------------------------------------------------------------------------------------------------
    def run(
        self, graph: str, inputs: Mapping[str, DeviceBuffer], outputs: Mapping[str, DeviceBuffer]
    ) -> None:
        """Run ``graph``: every input and every output bound exactly once, by name, to a buffer whose dtype and
        static dims match the manifest (a dynamic axis symbol takes the same value everywhere in one run); outputs
        may not overlap each other or any input.  ORT writes the outputs into the bound memory."""
        self._check_open("run")
        g = self._graphs.get(graph)
        if g is None:
            raise BackendError(
                f"OrtRuntime.run: graph {graph!r} is not loaded (loaded: {', '.join(self._graphs) or 'none'})"
            )
        bound, _ = self._check_bindings(
            graph,
            f"OrtRuntime.run({graph!r})",
            (("input", list(g.inputs.values()), inputs), ("output", list(g.outputs.values()), outputs)),
        )
        ptrs = {(b.kind, b.spec.name): b.addr for b in bound}
        b = g.binding
        dev, did = self._device_type, (self.device_id if self._device_type == "cuda" else 0)
        for kind, given in (("input", inputs), ("output", outputs)):
            for n, buf in given.items():
                sig = (buf.handle, buf.offset, buf.shape)
                if g.bound.get((kind, n)) == sig:
                    continue
                np_dtype = DTYPES[buf.dtype].type
                if kind == "input":
                    b.bind_input(n, dev, did, np_dtype, list(buf.shape), ptrs[(kind, n)])
                else:
                    b.bind_output(n, dev, did, np_dtype, list(buf.shape), ptrs[(kind, n)])
                    if n not in g.out_order:
                        g.out_order.append(n)
                g.bound[(kind, n)] = sig
        t0 = time.perf_counter()
        try:
            g.session.run_with_iobinding(b)
        except Exception as exc:
            g.bound.clear()
            g.out_order.clear()
            b.clear_binding_inputs()
            b.clear_binding_outputs()
            raise BackendError(f"OrtRuntime.run({graph!r}) on {self._primary} failed: {exc}") from exc
        self._count_run(graph, t0)
        self._ensure_in_place(graph, g, outputs, ptrs)

    def _ensure_in_place(
        self, graph: str, g: _Graph, outputs: Mapping[str, DeviceBuffer], ptrs: dict[tuple[str, str], int]
    ) -> None:
        """Check ORT wrote every output into the bound memory; copy (counted as d2d) where it did not."""
        got = g.binding.get_outputs()
        if len(got) != len(g.out_order):
            raise BackendError(
                f"OrtRuntime.run({graph!r}): ORT returned {len(got)} outputs for {len(g.out_order)} bound"
            )
        for n, ov in zip(g.out_order, got):
            buf = outputs[n]
            if not buf.nbytes or int(ov.data_ptr()) == ptrs[("output", n)]:
                continue
            key = f"{graph}/{n}"
            self.inplace_fallbacks[key] = self.inplace_fallbacks.get(key, 0) + 1
            a = self._allocs[buf.handle]
            if a.host is not None:
                np.copyto(self._host_window(a, buf), ov.numpy().reshape(buf.shape))
            else:
                self._cuda().copy(ptrs[("output", n)], int(ov.data_ptr()), buf.nbytes, _CudaRT.D2D, "run")
            self.stats.d2d_bytes += buf.nbytes

    # -- conveniences ------------------------------------------------------------------------------------------------
    def __enter__(self) -> OrtRuntime:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SHORT_PROVIDERS", "OrtRuntime"]
