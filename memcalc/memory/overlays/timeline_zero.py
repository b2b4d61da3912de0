"""The live bytes of one DeepSpeed ZeRO-0/1/2 step of a Hugging Face model, moment by moment.

DeepSpeed casts the module to the training dtype (``bf16``/``fp16``: ``enabled``), so the layers save what a pure
bf16 model saves (``memcalc.memory.engine.timeline`` with ``regime="bf16"``: the activations are the same to the byte,
traced) and only the model states and their transients differ. What a rank holds, read from DeepSpeed 0.19's code
and traced op by op on CPU ranks (``memcalc.validation.trace_deepspeed``; tests/test_timeline_zero.py), with
Ψ the parameter elements, N the data-parallel ranks, P = ⌈Ψ / 2N⌉·2 the ZeRO-1/2 partition
(``nccl_start_alignment_factor`` 2 × N, ``stage_1_and_2.py``), Σ the elements of the parameters that overlap the
rank's partition of the flat buffer (laid out in ``model.parameters()`` order), B ``reduce_bucket_size`` and
k = 2 with ``overlap_comm`` (two buckets), else 1:

- between steps: ZeRO-1/2: the flat buffer in the training dtype (2NP bytes) + the fp32 master partition (4P) +
  AdamW's moments (8P); ZeRO-0 (``FP16_UnfusedOptimizer`` / ``BF16`` wrapper): 2Ψ + fp32 copies 4Ψ + moments 8Ψ;
- backward: ZeRO-0 and ZeRO-1 keep autograd's gradients (2 bytes each) until the end of backward; ZeRO-1/2
  allocate the gradient bucket (2kB, ``setup_buckets``) at the first gradient hook; ZeRO-2 copies each gradient
  into the bucket and frees it in the hook (a parameter larger than B keeps its gradient until the next
  reduction), and from the first reduction holds its partition of the reduced gradients (2Σ, ``grads_in_partition``);
- end of backward: ZeRO-0 flattens all gradients for the all-reduce (2Ψ more, in buffers of at most 5e8 elements,
  ``engine.py`` ``MEMORY_OPT_ALLREDUCE_SIZE``); ZeRO-1 copies the gradients into the bucket and its partition:
  2Ψ + 2Σ + 2kB; ZeRO-2: 2Σ + 2kB + the last unreduced gradient (B ≥ Ψ, both: 2kB + the one bucket's flatten copy
  2Ψ, which dies before the 2Σ partition is allocated);
- optimizer step: ZeRO-1/2: fp64 copies of each gradient slice for the norm (2Σ + 8 × the largest slice), the
  flattened partition and its fp32 copy (2Σ + 2P + 4P), then AdamW on the fp32 partition (4P + its temporaries:
  for-loop 8P, foreach 4P, fused 0); ZeRO-0: the bf16 gradients and their fp32 copies (6Ψ) + AdamW's temporaries
  (for-loop: ``for_loop_peak``; foreach 4Ψ; fused 0). The all-gather of the updated partitions allocates nothing.

fp32 (neither ``fp16`` nor ``bf16`` enabled, as the Trainer's ``"auto"`` resolves without --fp16/--bf16): the module,
its gradients, the flat buffer and the buckets in 4 bytes; ZeRO-1/2 still clone the fp32 master partition from the
fp32 flat buffer (``single_partition_of_fp32_groups``) and the upcast of the flattened partition is the same tensor;
ZeRO-0 wraps nothing and the client optimizer steps the parameters (no fp32 copies). Traced on CPU ranks: the peak,
its phase, the baseline and the step's phases within 256 bytes (tests/validation/test_deepspeed_timeline.py).
"""

from __future__ import annotations

from memcalc.errors import InputError
from memcalc.layout.plan import REDUCE_BUCKET_SIZE
from memcalc.memory.engine.timeline import Moment, Timeline, _moment, timeline, with_loss
from memcalc.memory.engine.timeline_states import (adapter_tensors, buffer_bytes, lora_states, param_tensors,
                                                   step_temporaries)
from memcalc.model.architecture import Architecture
from memcalc.units import ceil_div

STAGES = (0, 1, 2)
PRECISIONS = ("bf16", "fp32")
"""The training dtype DeepSpeed casts the module to (bf16 or fp16: ``bf16``), or fp32 when neither is enabled."""
ALLREDUCE_BUFFER = 500_000_000
"""``MEMORY_OPT_ALLREDUCE_SIZE`` (``runtime/engine.py``): ZeRO-0 flattens gradients in buffers of this many."""
_GRADS = ("parameter gradients so far", "head and final norm gradients")


def module_dtype(precision: str, offload: bool, lora) -> tuple[str, int]:
    """(dtype, bytes per element) of the module DeepSpeed trains: ``bf16`` (bf16 or fp16 enabled: 2) or ``fp32``
    (neither: 4), the regime its layers save in. fp32 is modelled without offload and LoRA."""
    if precision not in PRECISIONS:
        raise InputError(f"precision {precision!r} under DeepSpeed's realistic timeline: accepted "
                         f"{', '.join(PRECISIONS)}")
    if precision == "fp32" and (offload or lora is not None):
        raise InputError("fp32 DeepSpeed (neither fp16 nor bf16 enabled): the realistic timeline models it without "
                         "offload and LoRA")
    return precision, 4 if precision == "fp32" else 2


def trainable(arch: Architecture, lora=None) -> tuple[tuple[str, int], ...]:
    """The tensors DeepSpeed's ZeRO-1/2 flattens, in ``model.parameters()`` order: those that require a gradient
    (``stage_1_and_2.py``: ``trainable_parameters``), every parameter, or peft's adapters alone under LoRA."""
    return param_tensors(arch) if lora is None else adapter_tensors(arch, lora)


def partition(arch: Architecture, dp: int, rank: int = 0, lora=None) -> tuple[int, int, int, frozenset[str]]:
    """(P, Σ, largest slice, names): rank ``rank``'s partition of the flat buffer, the elements of the parameters
    that overlap it, the largest overlap of one parameter with it, and those parameters' names."""
    tensors = trainable(arch, lora)
    psi = sum(n for _, n in tensors)
    p = ceil_div(psi, 2 * dp) * 2
    lo, hi = rank * p, (rank + 1) * p
    start = sigma = largest = 0
    names = []
    for name, n in tensors:
        end = start + n
        overlap = min(end, hi) - max(start, lo)
        if overlap > 0:
            sigma, largest = sigma + n, max(largest, overlap)
            names.append(name)
        start = end
    return p, sigma, largest, frozenset(names)


_STATES = ("parameters", "parameters (frozen base)", "parameters (LoRA adapters)", "optimizer states", "buffers")
"""The plain timeline's model states, which DeepSpeed's replace."""


def _walk(tl: Timeline, tensors: tuple[tuple[str, int], ...]):
    """The bf16 module's moments up to the step without its states: (moment, its other parts, the gradient bytes it
    holds, the parameters whose gradients a backward moment makes: its layer's, or the head's and final norm's).
    A layer's backward makes gradients even when none are held yet (LoRA: no head gradient comes first); the
    gradient bytes are then 0 and the layer's tensors are named."""
    root = [(name, n) for name, n in tensors if not name.startswith(("layer ", "embedding", "position"))]
    by_layer: dict[str, list[tuple[str, int]]] = {}  # "layer <i> <tensor>" under "<i>"
    for name, n in tensors:
        if name.startswith("layer "):
            by_layer.setdefault(name.split(" ", 2)[1], []).append((name, n))
    for m in tl.moments:
        if m.phase in ("optimizer", "zero_grad"):
            continue
        parts = [(n, x) for n, x in m.parts if n not in _STATES]
        grads = sum(x for n, x in parts if n in _GRADS) if m.phase.startswith("backward") else 0
        layer = m.phase.rsplit(".", 1)[1] if m.phase.startswith("backward.layer.") else None
        unit = list(by_layer.get(layer, ())) if layer is not None else root
        yield m, parts, grads, unit


def largest_piece(start: int, n: int, p: int) -> int:
    """The most elements of one parameter (elements ``start`` to ``start + n`` of the flat buffer) that fall in one
    rank's partition of ``p`` elements: what one rank's reduced slice of it can hold."""
    if n <= 0:
        return 0
    first = min(n, p - start % p)
    rest = n - first
    return max(first, min(rest, p)) if rest else first


def worst_rank(arch: Architecture, dp: int, lora=None) -> int:
    """The rank whose partition overlaps the most parameter elements (the largest gradient partition, Σ of
    ``partition``): one walk over the parameters, each adding its elements to every rank whose slice it overlaps."""
    tensors = trainable(arch, lora)
    p = ceil_div(sum(n for _, n in tensors), 2 * dp) * 2
    sigma = [0] * dp
    start = 0
    for _, n in tensors:
        for r in range(start // p, min(dp, -(-(start + n) // p))):
            sigma[r] += n
        start += n
    return max(range(dp), key=sigma.__getitem__)


def zero_timeline(arch: Architecture, *, family: str, stage: int, dp: int, attention: str, s: int, b: int,
                  recompute: str = "none", optimizer_impl: str = "fused", loss: str = "standard",
                  device: str = "cpu", bucket: int = REDUCE_BUCKET_SIZE, overlap_comm: bool = False,
                  rank: int = 0, compiled: bool = False, loss_compiled: bool | None = None,
                  position_ids: bool = False, use_cache: bool = True, offload: bool = False,
                  lora=None, precision: str = "bf16") -> Timeline:  # fmt: skip
    """Moments of one DeepSpeed ZeRO-``stage`` step (bf16 or fp16 training dtype, or fp32: ``precision``; torch AdamW
    client optimizer of ``optimizer_impl``, or DeepSpeed's FusedAdam: ``fused``) on data-parallel rank ``rank`` of
    ``dp``.
    ``lora``: peft adapters on a frozen base (``memcalc.model.lora.LoraPlan``, no 4-bit base): DeepSpeed flattens,
    partitions and reduces only the parameters that require a gradient, so every formula above reads Ψ as the
    adapters' elements (``adapter_tensors``), the frozen base stays whole in the training dtype on every rank, and
    the layers save what peft's layers save (traced: tests/validation/test_deepspeed_timeline.py).
    ``offload``: ``offload_optimizer`` cpu (``OFFLOAD_NOTE``; ZeRO-1/2 keep it in host memory); the moments are then
    the same on every rank but for the reduced slices on their way to the host, taken on the rank holding the
    largest."""
    if stage not in STAGES:
        raise InputError(f"ZeRO stage {stage}: the realistic timeline models stages 0, 1, 2")
    if dp < 1 or not 0 <= rank < dp or bucket < 0:
        raise InputError(f"dp {dp} must be positive, rank {rank} below it and reduce_bucket_size {bucket} 0 or more")
    dtype, w = module_dtype(precision, offload, lora)  # w: the module's and its gradients' bytes per element
    if lora is not None and lora.quantize != "none":
        raise InputError("LoRA under DeepSpeed ZeRO-0/1/2: the realistic timeline models a base in the training dtype "
                         "(--quantize none)")
    if offload:
        if stage not in (1, 2):
            raise InputError(f"offload_optimizer under ZeRO-{stage}: the realistic timeline models stages 1 and 2 "
                             "(stage 3: memcalc.memory.overlays.timeline_zero3)")
        if stage == 1 and overlap_comm:
            raise InputError("offload_optimizer under ZeRO-1 with overlap_comm: not modelled; without overlap_comm, "
                             "or ZeRO-2")
        return _offload_timeline(arch, family=family, stage=stage, dp=dp, attention=attention, s=s, b=b,
                                 recompute=recompute, loss=loss, device=device, bucket=bucket,
                                 overlap_comm=overlap_comm, compiled=compiled, loss_compiled=loss_compiled,
                                 position_ids=position_ids, use_cache=use_cache, lora=lora)
    if optimizer_impl not in ("foreach", "fused", "for-loop"):
        raise InputError(f"optimizer implementation {optimizer_impl!r} under DeepSpeed: accepted foreach, fused, "
                         "for-loop")  # fmt: skip
    tl = timeline(arch, family=family, regime=dtype, attention=attention, s=s, b=b, recompute=recompute,
                  optimizer_impl="fused", loss=loss, device=device, position_ids=position_ids, use_cache=use_cache,
                  compiled=compiled, loss_compiled=loss_compiled, lora=lora, hooked_grads=stage == 2)  # fmt: skip
    tensors = trainable(arch, lora)
    psi = sum(n for _, n in tensors)
    steps = 4  # torch AdamW's ``step`` tensor: one per parameter tensor it is handed (one flat group under ZeRO)
    states = [] if lora is None else [("parameters (frozen base)", _frozen(arch, family, lora))]
    if stage == 0:  # fp32: no wrapper, the client optimizer steps the module's own parameters
        states += [(f"parameters ({dtype})", w * psi),
                   ("fp32 copies of the parameters", 4 * psi if w == 2 else 0),
                   ("optimizer states (fp32 moments)", 8 * psi + steps * len(tensors))]
    else:  # (fp32: the master partition is a clone of the flat buffer's all the same)
        p, sigma, slice_max, mine = partition(arch, dp, rank, lora)
        states += [(f"parameters ({dtype} flat buffer)", w * dp * p),
                   ("fp32 master partition", 4 * p), ("optimizer states (fp32 moments)", 8 * p + steps)]
    states.append(("buffers", buffer_bytes(arch, family, w)))
    k = 2 if overlap_comm else 1
    made: list[tuple[str, int]] = []  # gradients made so far in backward, in the order autograd makes them
    reduced = False  # ZeRO-2: a bucket holding one of this rank's parameters was reduced (grads_in_partition exists)
    moments: list[Moment] = []
    for m, parts, grads, unit in _walk(tl, tensors):
        if (grads or (lora is not None and m.phase.startswith("backward.layer."))) and stage in (1, 2):
            parts.append(("gradient bucket (reduce_bucket_size)", w * k * bucket))
            if stage == 2:  # gradients go to the bucket in their hooks; larger ones wait for the next reduction
                # The partition is allocated at the first reduction after one of this rank's gradients was made. A
                # gradient that would overflow the bucket reduces it first (``reduce_independent_p_g_buckets_and_
                # remove_grads``); one larger than B skips the bucket (``extra_large_param_to_reduce``) and is
                # reduced at the next such overflow, so one of them waits at a time.
                new = [u for u in unit if u not in made]
                reduced = reduced or (any(name in mine for name, _ in made)
                                      and sum(n for _, n in made + new) > bucket)
                made += new
                pending = w * min(grads // w, max((n for _, n in unit if n > bucket), default=0))
                parts = [(n, x) for n, x in parts if n not in _GRADS]
                parts += [("gradient partition (grads_in_partition)", w * sigma if reduced else 0),
                          ("gradients not yet in the bucket", pending)]
        moments.append(_moment(m.phase, m.label, states + parts))
    inputs = [(n, x) for n, x in tl.moments[1].parts if n.startswith("input ids")]  # the model's position ids died
    base = states + inputs
    leaf = embedding_leaf(arch, s, b, lora)
    part = (p, sigma, slice_max) if stage else (0, 0, 0)
    return with_loss(tl, moments + _step_end(stage, base, leaf, tensors, dtype, w, bucket, k, optimizer_impl, part))


def _step_end(stage: int, base: list[tuple[str, int]], leaf: list[tuple[str, int]], tensors, dtype: str, w: int,
              bucket: int, k: int, optimizer_impl: str, part: tuple[int, int, int]) -> list[Moment]:  # fmt: skip
    """The backward's epilogue (the last reductions, or ZeRO-0's flattened all-reduce), the optimizer's step on the
    fp32 copies or partition, and the moment after it. ``part``: the rank's partition, the elements of its gradient
    partition and its largest slice (``partition``); ``k``: the buckets (two with overlap_comm)."""
    p, sigma, slice_max = part
    psi = sum(n for _, n in tensors)
    if stage == 0:
        end = [(f"gradients ({dtype})", w * psi),
               ("flattened gradients for the all-reduce", w * min(psi, ALLREDUCE_BUFFER))]
        end += leaf
        temp = step_temporaries(optimizer_impl, tensors, 4)  # on the fp32 copies (fp32: the parameters)
        step = [(f"gradients ({dtype})", w * psi), ("fp32 gradients", 4 * psi if w == 2 else 0)]
        moments = [_moment("backward.epilogue", "the gradients flattened for the all-reduce", base + end),
                   _moment("optimizer", "fp32 copies of the gradients", base + step),
                   _moment("optimizer.adamw", "AdamW on the fp32 copies", base + step + [("step temporaries", temp)])]
    else:
        # the first tensor's gradient is made last (the embedding's; under LoRA layer 0's first adapter's)
        last = tensors[0][1] if stage == 2 and tensors[0][1] > bucket else 0
        # One bucket holds every gradient (B ≥ Ψ): its flatten copy for the all-reduce dies with ``allreduce_bucket``,
        # before the partition (2Σ ≤ 2Ψ) is allocated (traced, every run alike once gloo's late releases are out of
        # sight: ``memcalc.validation.trace_deepspeed``)
        end = ([(f"gradients ({dtype})", w * (psi - _copied_first(tensors, bucket))),
                ("gradient partition (grads_in_partition)", w * sigma)]
               if stage == 1 and bucket < psi else
               [("bucket's flatten copy", w * psi)]
               if bucket >= psi else
               [("gradient partition (grads_in_partition)", w * sigma), ("gradient not yet reduced", w * last)])
        end.append(("gradient bucket (reduce_bucket_size)", w * k * bucket))
        end += leaf
        held = [("gradient partition (averaged_gradients)", w * sigma)]
        temp = step_temporaries(optimizer_impl, (("fp32 partition", p),), 4)
        moments = [
            _moment("backward.epilogue", "the last reductions", base + end),
            _moment("optimizer", "fp64 copy of a gradient slice for the norm", base + held
                    + [("fp64 gradient slice", 8 * slice_max)]),
            _moment("optimizer", "the partition flattened and upcast", base + held
                    + [(f"flattened partition ({dtype})", w * p),
                       ("fp32 gradient partition", 4 * p if w == 2 else 0)]),
            _moment("optimizer.adamw", "AdamW on the fp32 partition", base + [("fp32 gradient partition", 4 * p),
                                                                              ("step temporaries", temp)]),
        ]  # fmt: skip
    moments.append(_moment("zero_grad", "after the step: the gradients freed", base))
    return moments


def embedding_leaf(arch: Architecture, s: int, b: int, lora) -> list[tuple[str, int]]:
    """LoRA: ``enable_input_require_grads`` makes the embedding's output a leaf that requires a gradient; the loss's
    graph (its AccumulateGrad node) keeps it and its gradient alive until the loss is dropped, after
    ``engine.backward`` returns, so through DeepSpeed's end of backward (traced): 2 bytes an element each (the
    module's bf16), b·s·h elements. Nothing without LoRA."""
    return [] if lora is None else [("embedding output (a leaf: enable_input_require_grads) and its gradient",
                                     2 * 2 * s * b * arch.hidden)]


def _copied_first(tensors: tuple[tuple[str, int], ...], bucket: int) -> int:
    """ZeRO-1's end of backward (``reduce_gradients``) copies the gradients into the bucket in parameter order and
    frees each; the gradient partition is allocated at the first reduction, when the leading gradients that fit
    the bucket are gone already (none when the first is larger than the bucket: the embedding, reduced whole).
    Rank 0's count; a later rank's partition is allocated later, with fewer gradients left."""
    copied = 0
    for _, n in tensors:
        if copied + n > bucket:
            break
        copied += n
    return copied


def _frozen(arch: Architecture, family: str, lora) -> int:
    """Bytes of the frozen base in the training dtype (DeepSpeed casts the whole module; peft's base is left out of
    the flat buffer)."""
    st = lora_states(arch, family, 2, "fused", "adamw", lora)
    return st.params - st.grads


OFFLOAD_NOTE = ("DeepSpeed ZeRO-1/2 offload_optimizer: on the GPU the bf16 flat buffer, a bf16 staging buffer the size "
                "of the largest parameter (temp_grad_buffer_for_gpu_offload), the gradient bucket(s) and, as each "
                "bucket is reduced, the fp64 copy of each of the rank's gradient slices for its norm, then its fp32 "
                "copy for the host, one slice at a time; the fp32 master partition, its fp32 gradient, the moments and "
                "a bf16 copy-back buffer in host memory; read from DeepSpeed 0.19's stage_1_and_2.py, not traced (a "
                "CPU run cannot tell the devices apart)")


class _Buckets:
    """DeepSpeed's gradient bucket under offload_optimizer (``reduce_independent_p_g_buckets_and_remove_grads``): a
    gradient that would overflow the bucket reduces it first; one larger than the bucket is cloned into a tensor of
    its own (``_offload_gradient_safety_enabled``) and reduced alone at the next overflow. Each reduction copies the
    rank's slice of every parameter in it to the host (``copy_grads_in_partition``): an fp64 copy for its norm
    (``set_norm_for_param_grad_in_gpu``: 8 bytes an element), then an fp32 one (4 bytes), one slice at a time."""

    def __init__(self, bucket: int, piece: dict[str, int]) -> None:
        self.bucket, self.piece = bucket, piece
        self.held: list[tuple[str, int]] = []
        self.elements = 0

    @property
    def own(self) -> int:
        """Bytes of the gradient waiting in a tensor of its own (larger than the bucket)."""
        return sum(2 * n for _, n in self.held if n > self.bucket)

    def flush(self) -> tuple[int, int]:
        """Reduce what the bucket holds: (bytes of a gradient reduced from its own tensor, the most bytes its
        slices take on their way to the host)."""
        out = (self.own, 8 * max((self.piece[name] for name, _ in self.held), default=0))
        self.held, self.elements = [], 0
        return out

    def add(self, name: str, n: int) -> tuple[int, int, int]:
        """A gradient of ``n`` elements arrives (its own 2n bytes not counted): (the most bytes beside it while
        the bucket is reduced, while it is cloned, and after)."""
        flushed = sum(self.flush()) if self.elements + n > self.bucket else 0
        self.held.append((name, n))
        self.elements += n
        return flushed, self.own if n > self.bucket else 0, self.own


def _offload_timeline(arch: Architecture, *, family: str, stage: int, dp: int, attention: str, s: int, b: int,
                      recompute: str, loss: str, device: str, bucket: int, overlap_comm: bool, compiled: bool,
                      loss_compiled: bool | None, position_ids: bool, use_cache: bool,
                      lora=None) -> Timeline:  # fmt: skip
    """``zero_timeline`` with ``offload_optimizer``: DeepSpeed 0.19 ``stage_1_and_2.py`` with ``cpu_offload``. The
    GPU keeps the bf16 flat buffer (2NP) and ``temp_grad_buffer_for_gpu_offload`` (bf16, the largest parameter);
    no gradient partition (``copy_grads_in_partition`` sends each slice to the host's fp32 ``.grad``); the step
    runs on the host (DeepSpeedCPUAdam) and copies the bf16 partition back through a pinned host buffer (``copy_``,
    no GPU temporary). ZeRO-2 reduces in its gradient hooks; ZeRO-1 keeps autograd's gradients to the end of
    backward and reduces them in parameter order (``reduce_gradients``), each gradient freed as it is copied into
    the bucket (its ``.data`` becomes the bucket's view).
    ``lora``: as without offload, the flat buffer, the buckets, the staging buffer and the host's states are the
    adapters' (``trainable``) and the frozen base stays whole in bf16 beside them (composed from the two traced steps,
    not traced itself)."""
    tl = timeline(arch, family=family, regime="bf16", attention=attention, s=s, b=b, recompute=recompute,
                  optimizer_impl="fused", loss=loss, device=device, position_ids=position_ids, use_cache=use_cache,
                  compiled=compiled, loss_compiled=loss_compiled, lora=lora, hooked_grads=stage == 2)  # fmt: skip
    tensors = trainable(arch, lora)
    psi = sum(n for _, n in tensors)
    p = partition(arch, dp, lora=lora)[0]
    piece, start = {}, 0
    for name, n in tensors:
        piece[name] = largest_piece(start, n, p)
        start += n
    states = [] if lora is None else [("parameters (frozen base)", _frozen(arch, family, lora))]
    states += [("parameters (bf16 flat buffer)", 2 * dp * p),
               ("gradient staging buffer (temp_grad_buffer_for_gpu_offload)", 2 * max(n for _, n in tensors)),
               ("buffers", buffer_bytes(arch, family, 2))]  # fmt: skip
    slots = ("gradient bucket (reduce_bucket_size)", 2 * (2 if overlap_comm else 1) * bucket)
    buckets = _Buckets(bucket, piece)
    made: set[str] = set()
    moments: list[Moment] = []
    for m, parts, grads, unit in _walk(tl, tensors):
        if grads or (lora is not None and m.phase.startswith("backward.layer.")):
            parts.append(slots)
            if stage == 2:
                extra = max((_at(buckets.add(name, n), n) for name, n in unit if name not in made), default=0)
                made.update(name for name, _ in unit)
                parts = [(n, x) for n, x in parts if n not in _GRADS]
                parts += [("gradients not yet reduced", buckets.own),
                          ("gradients on their way to the host", max(0, extra - buckets.own))]
        moments.append(_moment(m.phase, m.label, states + parts))
    inputs = [(n, x) for n, x in tl.moments[1].parts if n.startswith("input ids")]
    base = states + inputs
    if stage == 2:  # the embedding's gradient arrives last, then the last bucket is reduced
        extra = max((_at(buckets.add(name, n), n) for name, n in tensors if name not in made), default=0)
        extra = max(extra, sum(buckets.flush()))
        tail = [("gradients not yet reduced or on their way to the host", extra)]
    else:  # reduce_gradients: every gradient alive, each copied into the bucket in parameter order
        left, extra = 2 * psi, 0
        for name, n in tensors:
            flushed, cloned, after = buckets.add(name, n)
            extra = max(extra, left + flushed, left + cloned, left - 2 * n + after)
            left -= 2 * n
        extra = max(extra, sum(buckets.flush()))
        tail = [("gradients not yet reduced or on their way to the host", extra)]
    tail += embedding_leaf(arch, s, b, lora)
    moments.append(_moment("backward.epilogue", "the last reductions", base + [slots] + tail))
    moments += [_moment("optimizer", "DeepSpeedCPUAdam on the host, the bf16 partition copied back", base),
                _moment("zero_grad", "after the step", base)]
    return with_loss(tl, moments)


def _at(moments: tuple[int, int, int], n: int) -> int:
    """The most bytes one arriving gradient of ``n`` elements has beside the moment's others (``_Buckets.add``): its
    own 2n bytes while its hook reduces the bucket or clones it; a gradient copied into the bucket is not counted, as
    in the traced step without offload."""
    flushed, cloned, after = moments
    return max(flushed + 2 * n if flushed else 0, cloned + 2 * n if cloned else 0, after)
