"""The communication of a tensor- and pipeline-parallel replica, priced by the GPUs' interconnect.

Alpha-beta model (Hockney): moving a message of ``S`` bytes costs ``alpha + S / B`` seconds,
``alpha`` the link's fixed cost per collective or send (:attr:`GpuSpec.link_latency_s`) and ``B``
its bandwidth per GPU per direction (:attr:`GpuSpec.link_bytes_per_s`) times an achieved fraction
``eff`` (like the roofline's ``mfu``/``mbu``: 0.8 by default, what NCCL reaches of the datasheet
figure on large messages: Vidur's H100 DGX profile shows 305-366 GB/s of the 450, the catalog's
notes cite it). One ``alpha`` serves both the all-reduce and the send (the profile's send
intercept is smaller, 8 us against 24-35 us: a step has at most ``pp - 1`` sends, so the send's
share is small).

- **Tensor parallelism** (Megatron-style, as vLLM shards a layer): every transformer layer ends
  its attention and its MLP with an all-reduce of the step's activations, two a layer. A ring
  all-reduce over ``tp`` GPUs moves ``2 (tp - 1) / tp`` times the message through each GPU's
  link, so one costs ``alpha + 2 (tp - 1) / tp x S / (B eff)``, with ``S = T x hidden x a`` for
  the ``T = P + D`` tokens of the step (``P`` prompt tokens, ``D`` decodes) in activations of
  ``a`` bytes (2: bf16). A step pays ``2 n_layers`` of them.
- **Pipeline parallelism**: the layers are split over ``pp`` stages; a step's activations cross
  the ``pp - 1`` stage boundaries once, a point-to-point send of ``S`` bytes each,
  ``alpha + S / (B eff)``.

Both are linear in ``T``: ``comm = c0 + c_tok x T`` (:class:`ParallelComm`). The step-time
roofline adds it to ``max(compute, memory)`` (communication is not overlapped with compute in
vLLM's forward pass). Not modelled: links between servers (a replica is one server's GPUs),
all-reduce algorithms other than the ring (NCCL's tree, vLLM's one-shot custom all-reduce for
small messages: their latency is what ``alpha`` stands for), and the sequence-parallel split of
the all-reduce into reduce-scatter and all-gather (the same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmqueue._result import Result
from llmqueue._validate import positive, positive_int, probability
from llmqueue.errors import InputError
from llmqueue.hardware.catalog import get_gpu, get_model
from llmqueue.hardware.specs import GpuSpec, ModelSpec

#: bytes of one activation element (bf16/fp16: vLLM's activations stay 16-bit with fp8 weights)
ACT_BYTES = 2
#: achieved fraction of the link's bandwidth (assumption; see the module docstring)
LINK_EFFICIENCY = 0.8


def allreduce_time(*, S: float, tp: int, bw: float, alpha: float) -> float:
    """Seconds of one ring all-reduce of ``S`` bytes over ``tp`` GPUs whose links carry ``bw``
    bytes/s each way: ``alpha + 2 (tp - 1) / tp x S / bw`` (0 for ``tp = 1``: nothing to reduce)."""
    tp = positive_int("tensor_parallel_size", tp)
    if tp == 1:
        return 0.0
    return alpha + 2.0 * (tp - 1) / tp * S / positive("link_bytes_per_s", bw)


def send_time(*, S: float, bw: float, alpha: float) -> float:
    """Seconds of one point-to-point send of ``S`` bytes: ``alpha + S / bw``."""
    return alpha + S / positive("link_bytes_per_s", bw)


@dataclass(frozen=True)
class ParallelComm(Result):
    """Communication seconds of one step of ``T`` tokens: ``c0 + c_tok x T``, split into the
    tensor-parallel all-reduces (``tp_c0``, ``tp_c_tok``) and the pipeline sends (``pp_c0``,
    ``pp_c_tok``). ``allreduces`` and ``sends`` count the collectives of a step."""

    model: str
    gpu: str
    link: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    link_bytes_per_s: float
    link_latency_s: float
    efficiency: float
    allreduces: int
    sends: int
    tp_c0: float
    tp_c_tok: float
    pp_c0: float
    pp_c_tok: float

    @property
    def c0(self) -> float:
        return self.tp_c0 + self.pp_c0

    @property
    def c_tok(self) -> float:
        return self.tp_c_tok + self.pp_c_tok

    def seconds(self, T: int) -> float:
        """Communication seconds of a step of ``T`` tokens (prompt tokens plus decodes)."""
        return self.c0 + self.c_tok * T


def parallel_comm(model: ModelSpec | str, gpu: GpuSpec | str, *, tensor_parallel_size: int = 1,
                  pipeline_parallel_size: int = 1, efficiency: float = LINK_EFFICIENCY) -> ParallelComm:
    """The communication of one step of ``model`` on ``tp x pp`` GPUs of type ``gpu`` (the module
    docstring's model): per step ``2 n_layers`` all-reduces (when ``tp > 1``) and ``pp - 1`` sends,
    each linear in the step's tokens. Raises :class:`InputError` when parallel and the GPU has no
    interconnect figure."""
    m, g = get_model(model), get_gpu(gpu)
    tp = positive_int("tensor_parallel_size", tensor_parallel_size)
    pp = positive_int("pipeline_parallel_size", pipeline_parallel_size)
    eff = probability("link_efficiency", efficiency, open_low=True, open_high=False)
    if (tp > 1 or pp > 1) and not g.link_bytes_per_s > 0:
        raise InputError("gpu", f"{g.name} has no interconnect bandwidth in the catalog, needed with "
                         f"tensor_parallel_size {tp} x pipeline_parallel_size {pp}",
                         "use tensor_parallel_size 1 and pipeline_parallel_size 1, or a GPU whose link is known")
    bw = g.link_bytes_per_s * eff
    per_tok = m.hidden_size * ACT_BYTES  # bytes of one token's activations
    n_ar = 2 * m.n_layers if tp > 1 else 0
    tp_c0 = n_ar * allreduce_time(S=0.0, tp=tp, bw=bw, alpha=g.link_latency_s) if tp > 1 else 0.0
    tp_c_tok = n_ar * 2.0 * (tp - 1) / tp * per_tok / bw if tp > 1 else 0.0
    n_send = pp - 1
    pp_c0 = n_send * g.link_latency_s
    pp_c_tok = n_send * per_tok / bw if pp > 1 else 0.0
    return ParallelComm(model=m.name, gpu=g.name, link=g.link, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                        link_bytes_per_s=g.link_bytes_per_s, link_latency_s=g.link_latency_s, efficiency=eff,
                        allreduces=n_ar, sends=n_send, tp_c0=tp_c0, tp_c_tok=tp_c_tok, pp_c0=pp_c0, pp_c_tok=pp_c_tok)
