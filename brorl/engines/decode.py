"""Fixed-shape decoding of one chunk of rows: a cache allocated once, a step with no host sync.

A chunk (`brorl.engines.hf`) decodes in a layout whose shapes hold for its whole life. Each
layer's key/value cache is allocated once for all `max_response_tokens` positions (after the
prompt's, with plain attention) and written in place at the step's position (`FixedCache`); the
step counter, the rows' tokens, log-probs, lengths and stop flags are tensors updated in place;
rows that stop stay in the batch, masked (they are fed the pad id and nothing of theirs is
recorded). The step (`Decoder.step`: temperature, top-p and the stop check on the device, then one
forward) therefore reads nothing back to the host (no `.item()`, `nonzero` or data-dependent
shape) and compiles with `torch.compile(fullgraph=True)`; on CUDA it is captured as CUDA graphs
(mode "reduce-overhead"), one per bucket.

The host looks at the rows every `stop_check_tokens` steps (one sync): the chunk ends once every
row has stopped, and once the live rows fit a smaller bucket (`buckets`: compiled C, C/2, C/4,
... down to C/16; eager every count, so stopped rows leave at each check) it is compacted to it
(the rows that leave are written back, the caches copied once), so a chunk whose responses end
early stops paying for them. A chunk with fewer rows than its bucket
(the call's last) is padded with filler rows that start stopped and are never written back. The
prompt caches are padded to `prompt_width` positions (a power of two) and a fixed group count, so
all chunks of a bucket, and calls with similar prompts, share one compiled step. The shared-prefix
attention (`brorl.policy.prefix.shared_prefix_attention`) masks the cache positions not yet
written (`SharedPrefix.newest`); plain attention gets a 4-D mask.

Every tensor the step reads or writes lives in the engine's `Buffers`, allocated once at the
call's largest chunk: a chunk of C rows (a bucket) uses the first C rows of each, a compaction
gathers the live rows into the first rows of the same buffers. A bucket's tensors therefore keep
their addresses across the call's chunks and, where the step is captured as CUDA graphs, across
calls too (the engine keeps its buffers between calls then), so a bucket's graph is recorded once
and replayed by every later chunk and call (torch records a graph again whenever a static input
moves, and stops capturing it after 128 such records). The price: with CUDA graphs the decode
buffers stay allocated while the trainer updates (size them with
`generate.max_concurrent_rollouts` where the update needs the memory). Calls with other shapes
(prompt width, response length, group count) replace the buffers rather than add to them.

Deliberately ignored: refilling finished rows with new ones (continuous batching), paged caches.
Paper: BroRL §4.2.4 (one shared prefix per prompt, many concurrent rollouts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from brorl.engines.base import SamplingConfig, counter_uniform, sample_tokens, sampling_logprobs
from brorl.policy.prefix import Prefix, SharedPrefix, group_prefixes, left_pad

if TYPE_CHECKING:
    from brorl.params.rl import CompileSetting

MIN_BUCKET_SHARE = 16
"""The smallest bucket of a chunk of C rows holds C / 16 of them (rounded up): at most five
halvings, so a compiled step stays within dynamo's default of 8 compiled versions per function."""

RECOMPILE_LIMIT = 64
"""Compiled versions dynamo may keep of the step (its default is 8): buckets times the
policy and evaluation samplers' settings (temperature, top-p, response length, prompt width)."""

class Buffers:
    """Tensors kept across chunks and calls, one per name, handed out as their first rows.

    `view(name, shape, dtype, device)` returns `base[:shape[0]]` of the named buffer: the same
    memory (and address) for every chunk and bucket, as long as the other dimensions, the dtype
    and the device stay the same; a request that does not fit (more rows, or other dimensions)
    frees the old buffer first and allocates a new one at the request's shape."""

    def __init__(self) -> None:
        self.store: dict[str, torch.Tensor] = {}

    def view(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        """The first `shape[0]` rows of buffer `name` (contents as left by its last user)."""
        base = self.store.get(name)
        if base is None or base.dtype != dtype or base.device != device \
                or base.shape[1:] != shape[1:] or base.shape[0] < shape[0]:
            self.store.pop(name, None)
            del base  # freed before its replacement is allocated
            base = self.store[name] = torch.empty(shape, dtype=dtype, device=device)
        return base[:shape[0]]

    def hold(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """`x` copied into buffer `name`'s first rows (`x` may be a gather of those rows)."""
        return self.view(name, tuple(x.shape), x.dtype, x.device).copy_(x)

    def full(self, name: str, shape: tuple[int, ...], value: float | bool, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        """Buffer `name`'s first rows, filled with `value`."""
        return self.view(name, shape, dtype, device).fill_(value)

    def nbytes(self) -> int:
        """Bytes the buffers hold (on CUDA, memory a new call may count as free: it reuses or
        replaces them)."""
        return sum(t.numel() * t.element_size() for t in self.store.values())


def prompt_width(length: int) -> int:
    """Positions the prompt caches of a call whose longest prompt has `length` tokens are padded
    to: the next power of two, at least 32, so calls with similar prompts share compiled steps."""
    return max(32, 1 << (length - 1).bit_length())


def buckets(rows: int, compiled: bool = True) -> list[int]:
    """The row counts a chunk of at most `rows` rows decodes at, largest first. Compiled: `rows`,
    then halved (rounded up) while at least `rows / MIN_BUCKET_SHARE` (rounded up), one graph
    each. Eager: every count, so stopped rows leave at each stop check (a new shape costs an
    eager step nothing)."""
    if not compiled:
        return list(range(rows, 0, -1))
    floor = -(-rows // MIN_BUCKET_SHARE)
    sizes = [rows]
    while sizes[-1] > 1 and -(-sizes[-1] // 2) >= floor:
        sizes.append(-(-sizes[-1] // 2))
    return sizes


def fit_bucket(sizes: list[int], rows: int) -> int:
    """The smallest of `sizes` that holds `rows` rows."""
    return min(size for size in sizes if size >= rows)


def use_compile(setting: CompileSetting, device: torch.device) -> bool:
    """Whether `generate.compile` compiles the decode step on `device`: `auto` compiles on CUDA
    (where the eager step is bound by kernel launches) and not on CPU. Measured on this 2-core
    CPU (4 prompts x 64 rows, 64 tokens, one thread): the tiny policy's compiled step decodes
    1.3x the eager tokens/s, a 512-wide 4-layer one's no more than eager (within the machine's
    noise), and a cold compile costs 20-30 s per bucket, which short CPU runs and the tests
    never earn back."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


class FixedCache:
    """The rows' key/value cache allocated once: per layer `[C, H_kv, L, D]`, written in place at
    position `step + offset` (`step` the chunk's `[1]` counter). It provides the one method the
    decoder layers call on a transformers `Cache` (`update`), returning the whole buffers."""

    is_compileable = True

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], step: torch.Tensor,
                 offset: int) -> None:
        self.keys, self.values, self.step, self.offset = keys, values, step, offset
        self.limit: int | None = None
        """Eager decoding: the positions written so far (the host counts the steps), the only
        ones `update` hands to attention; None (compiled): the whole buffers."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one position's keys and values `[C, H_kv, 1, D]` of layer `layer_idx`."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        position = self.step + self.offset if self.offset else self.step
        keys.index_copy_(2, position, key_states)
        values.index_copy_(2, position, value_states)
        if self.limit is not None:
            return keys[:, :, :self.limit], values[:, :, :self.limit]
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Not used (positions are always given); the whole buffer's length."""
        return self.keys[layer_idx].shape[2]

    def select(self, rows: torch.Tensor, buffers: Buffers) -> FixedCache:
        """The cache of rows `rows` only, gathered into the first rows of the same `buffers`
        layer by layer (one layer's gather held at a time)."""
        for kind, layers in (("key", self.keys), ("value", self.values)):
            for layer, buffer in enumerate(layers):
                layers[layer] = buffers.hold(f"{kind}{layer}", buffer[rows])
        return self


@dataclass
class Chunk:
    """A chunk's decoding state, `[C, ...]` tensors updated in place by the step."""

    ids: torch.Tensor
    """`[C]` the call's row ids; -1 for filler rows."""
    seeds: torch.Tensor
    """`[C]` each row's rollout id in the draw (`counter_uniform`)."""
    positions: torch.Tensor
    """`[C]` each row's prompt length: the position of its first response token."""
    logits: torch.Tensor
    """`[C, V]` float32: the logits of each row's next token."""
    tokens: torch.Tensor
    """`[C, T]` response tokens (pad after the end)."""
    logprobs: torch.Tensor
    """`[C, T]` float32 sampling log-probs of the tokens (0 after the end)."""
    lengths: torch.Tensor
    """`[C]` tokens generated per row."""
    done: torch.Tensor
    """`[C]` bool: the row ended on a stop token (or is a filler)."""
    step: torch.Tensor
    """`[1]` int64: the position the next step writes."""
    cache: FixedCache
    """The rows' keys and values (responses only with shared-prefix attention)."""
    shared: SharedPrefix | None = None
    """The prompts' caches (shared-prefix attention); None with plain attention."""
    prompt_mask: torch.Tensor | None = None
    """Plain attention: `[C, L]` bool, the prompt positions each row attends (left padding off)."""
    response_pos: torch.Tensor | None = None
    """Plain attention: `[L]` each cache position's response index (T for prompt positions)."""

    @property
    def rows(self) -> int:
        """C, the chunk's row count (its bucket)."""
        return len(self.ids)

    def select(self, keep: torch.Tensor, width: int | None, buffers: Buffers) -> Chunk:
        """The chunk of rows `keep` (ascending indices), gathered into the first rows of the
        same `buffers`, the grid's M set to `width`."""
        if self.shared is not None:
            self.shared.max_width = width
            self.shared.keep(keep)
            hold_layout(self.shared, buffers)
        mask = None if self.prompt_mask is None else buffers.hold("prompt_mask",
                                                                  self.prompt_mask[keep])

        def gather(name: str) -> torch.Tensor:
            return buffers.hold(name, getattr(self, name)[keep])

        return Chunk(ids=gather("ids"), seeds=gather("seeds"), positions=gather("positions"),
                     logits=gather("logits"), tokens=gather("tokens"),
                     logprobs=gather("logprobs"), lengths=gather("lengths"),
                     done=gather("done"), step=self.step, cache=self.cache.select(keep, buffers),
                     shared=self.shared, prompt_mask=mask, response_pos=self.response_pos)


def hold_layout(shared: SharedPrefix, buffers: Buffers) -> None:
    """Move the rows' layout of `shared` (`group`, `slot`) into `buffers`."""
    shared.group = buffers.hold("group", shared.group)
    shared.slot = buffers.hold("slot", shared.slot)


def hold_prefix(shared: SharedPrefix, buffers: Buffers) -> None:
    """Move the prompt caches of `shared` and their mask bias into `buffers` (and its layout)."""
    shared.kv = [(buffers.hold(f"prefix_key{layer}", k), buffers.hold(f"prefix_value{layer}", v))
                 for layer, (k, v) in enumerate(shared.kv)]
    shared.bias = buffers.hold("bias", shared.bias)
    hold_layout(shared, buffers)


def _new_chunk(ids: torch.Tensor, fill: int, seeds: torch.Tensor, positions: torch.Tensor,
               logits: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], length: int,
               t_max: int, pad_id: int, buffers: Buffers) -> Chunk:
    """A chunk of rows `ids [c]` (rollout ids `seeds [c]`, `SamplingConfig.rollout_ids`) padded
    with `fill` fillers (copies of the last row, stopped), in the first rows of `buffers`: its
    cache `length` positions per layer, `kv` (per layer `[c, H, P, D]`) in its last P before
    `length - t_max`."""
    device, rows = ids.device, len(ids) + fill
    step = buffers.full("step", (1,), 0, torch.long, device)
    keys, values = [], []
    end = length - t_max
    for layer, (k, v) in enumerate(kv):
        for kind, src, dst in (("key", k, keys), ("value", v, values)):
            buf = buffers.full(f"{kind}{layer}", (rows, src.shape[1], length, src.shape[3]), 0,
                               src.dtype, device)
            buf[:len(ids), :, end - src.shape[2]:end] = src
            buf[len(ids):, :, end - src.shape[2]:end] = src[-1:]
            dst.append(buf)

    def padded(name: str, x: torch.Tensor) -> torch.Tensor:
        """`x [c, ...]` with the last row repeated for the fillers, in buffer `name`."""
        held = buffers.view(name, (rows, *x.shape[1:]), x.dtype, device)
        held[:len(x)] = x
        held[len(x):] = x[-1:]
        return held

    filler = buffers.full("ids", (rows,), -1, ids.dtype, device)
    filler[:len(ids)] = ids
    done = buffers.full("done", (rows,), True, torch.bool, device)
    done[:len(ids)] = False
    return Chunk(
        ids=filler, seeds=padded("seeds", seeds), positions=padded("positions", positions),
        logits=padded("logits", logits.float()),
        tokens=buffers.full("tokens", (rows, t_max), pad_id, torch.long, device),
        logprobs=buffers.full("logprobs", (rows, t_max), 0, torch.float32, device),
        lengths=buffers.full("lengths", (rows,), 0, torch.long, device),
        done=done, step=step, cache=FixedCache(keys, values, step, end))


def shared_chunk(prefixes: dict[int, Prefix], ids: torch.Tensor, n: int, bucket: int,
                 groups: int, p_width: int, sampling: SamplingConfig, pad_id: int,
                 buffers: Buffers) -> Chunk:
    """The chunk of rows `ids` (prompt-major ids of a call with `n` rows per prompt) attending
    their prompts' caches once each: padded to `bucket` rows, `groups` prompt slots of `p_width`
    positions plus one for the fillers; the rows' cache holds responses only. Its tensors are
    the first rows of `buffers`."""
    shared, positions, logits = group_prefixes(prefixes, ids // n, max_width=min(bucket, n),
                                               p_width=p_width, n_groups=groups + 1)
    fill = bucket - len(ids)
    shared.pad(fill)
    k = shared.kv[0][0]
    layers = [(k.new_zeros(len(ids), k.shape[1], 0, k.shape[3]),) * 2 for _ in shared.kv]
    t_max = sampling.max_response_tokens
    chunk = _new_chunk(ids, fill, sampling.rollout_ids(ids, n), positions, logits, layers, t_max,
                       t_max, pad_id, buffers)
    hold_prefix(shared, buffers)
    shared.newest = chunk.step
    chunk.shared = shared
    return chunk


def plain_chunk(model: torch.nn.Module, prompts: list[tuple[int, ...]], ids: torch.Tensor,
                n: int, bucket: int, p_width: int, sampling: SamplingConfig,
                pad_id: int, buffers: Buffers) -> Chunk:
    """The chunk of rows `ids` with plain attention: each row prefills its own copy of its prompt
    (`prompts`, one per row, left-padded and masked) into the first `p_width` cache positions.
    Its tensors are the first rows of `buffers`."""
    tokens, mask, positions = left_pad(prompts)
    device = ids.device
    result = model(input_ids=tokens.to(device), attention_mask=mask.long().to(device),
                   position_ids=positions.to(device), use_cache=True, logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in result.past_key_values.layers]
    t_max = sampling.max_response_tokens
    fill = bucket - len(ids)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    chunk = _new_chunk(ids, fill, sampling.rollout_ids(ids, n), lengths, result.logits[:, -1], kv,
                       p_width + t_max, t_max, pad_id, buffers)
    visible = buffers.full("prompt_mask", (bucket, p_width + t_max), False, torch.bool, device)
    visible[:len(ids), p_width - mask.shape[1]:p_width] = mask.to(device)
    visible[len(ids):] = visible[len(ids) - 1]
    chunk.prompt_mask = visible
    cols = torch.arange(p_width + t_max, device=device)
    chunk.response_pos = buffers.hold("response_pos",
                                      torch.where(cols >= p_width, cols - p_width, t_max))
    return chunk


class Decoder:
    """The decode step of one call's sampling settings, run eagerly or compiled
    (`torch.compile(fullgraph=True)`; on CUDA mode "reduce-overhead", CUDA graphs)."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, stop_ids: torch.Tensor,
                 pad_id: int, compiled: bool, backend: str = "inductor") -> None:
        self.model = model
        self.temperature, self.top_p = sampling.temperature, sampling.top_p
        self.seed = torch.tensor([sampling.seed], device=stop_ids.device)
        """`[1]` int64: a tensor, so a new seed per call reuses the compiled step."""
        self.stop_ids, self.pad_id = stop_ids, pad_id
        self.compiled = compiled
        self.buckets_run: set[int] = set()
        """The row counts the step ran at (`decode_chunk` records them; one graph each)."""
        self.addresses: dict[int, set[tuple[int, ...]]] = {}
        """Per bucket, the addresses of the tensors the step was bound to (`bind`): one tuple
        per bucket when the buffers are reused, as a CUDA graph needs."""
        self.graphs = compiled and stop_ids.device.type == "cuda" and backend == "inductor"
        """Whether the compiled step is captured as CUDA graphs (its buffers marked static)."""
        if compiled:
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        self.run = torch.compile(self.step, fullgraph=True, dynamic=False, backend=backend,
                                 mode="reduce-overhead" if self.graphs else None) \
            if compiled else self.step

    def bind(self, chunk: Chunk) -> None:
        """Before a chunk's first step (and after each compaction): record its bucket, and for
        CUDA graphs mark the buffers the step reads and writes in place as static inputs (a
        graph replays on their addresses; a new chunk's buffers re-record it once)."""
        self.buckets_run.add(chunk.rows)
        tensors = self.inputs(chunk)
        self.addresses.setdefault(chunk.rows, set()).add(tuple(t.data_ptr() for t in tensors))
        if self.graphs:
            for tensor in tensors:
                torch._dynamo.mark_static_address(tensor, guard=False)

    @staticmethod
    def inputs(chunk: Chunk) -> list[torch.Tensor]:
        """The tensors of `chunk` the step reads or writes in place."""
        tensors = [chunk.ids, chunk.seeds, chunk.positions, chunk.logits, chunk.tokens,
                   chunk.logprobs, chunk.lengths, chunk.done, chunk.step,
                   *chunk.cache.keys, *chunk.cache.values]
        if chunk.shared is not None:
            shared = chunk.shared
            tensors += [shared.bias, shared.slot, shared.group,
                        *(t for layer in shared.kv for t in layer)]
        if chunk.prompt_mask is not None and chunk.response_pos is not None:
            tensors += [chunk.prompt_mask, chunk.response_pos]
        return tensors

    def step(self, chunk: Chunk) -> None:
        """One token for every row of `chunk`, in place, with no host sync: sample from the
        logits (greedy at temperature 0, else inverse CDF with the row's counter uniform), record
        the live rows' tokens, log-probs and lengths, flag stop tokens, then run the model on the
        tokens (stopped rows are fed the pad id) for the next logits."""
        s = chunk.step
        logp = sampling_logprobs(chunk.logits, self.temperature, self.top_p)
        if self.temperature == 0:
            tokens = logp.argmax(dim=-1)
        else:
            tokens = sample_tokens(logp, counter_uniform(self.seed, chunk.seeds, s))
        live = ~chunk.done
        tokens = torch.where(live, tokens, self.pad_id)
        picked = logp.gather(-1, tokens[:, None])
        chunk.tokens.index_copy_(1, s, tokens[:, None])
        chunk.logprobs.index_copy_(1, s, torch.where(live[:, None], picked, 0.0))
        chunk.lengths.copy_(torch.where(live, s + 1, chunk.lengths))
        chunk.done.copy_(chunk.done | (live & (tokens[:, None] == self.stop_ids).any(dim=-1)))
        chunk.logits.copy_(self.next_logits(chunk, tokens))
        s.add_(1)

    def next_logits(self, chunk: Chunk, tokens: torch.Tensor) -> torch.Tensor:
        """`[C, V]` float32 logits after feeding `tokens [C]` at each row's next position."""
        position_ids = (chunk.positions + chunk.step)[:, None]
        if chunk.shared is not None:
            return self.model(input_ids=tokens[:, None], position_ids=position_ids,
                              past_key_values=chunk.cache, use_cache=True,
                              shared_prefix=chunk.shared).logits[:, -1].float()
        assert chunk.prompt_mask is not None and chunk.response_pos is not None
        visible = chunk.prompt_mask | (chunk.response_pos <= chunk.step)
        if chunk.cache.limit is not None:
            visible = visible[:, :chunk.cache.limit]
        return self.model(input_ids=tokens[:, None], attention_mask=visible[:, None, None, :],
                          position_ids=position_ids, past_key_values=chunk.cache,
                          use_cache=True).logits[:, -1].float()


@dataclass
class Results:
    """A call's rows, filled chunk by chunk: tokens and log-probs `[R, T]`, lengths and stop
    flags `[R]`."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor


def write_back(chunk: Chunk, out: Results) -> None:
    """Copy the chunk's real rows (not its fillers) into the call's results."""
    real = (chunk.ids >= 0).nonzero().squeeze(-1)
    ids = chunk.ids[real]
    out.tokens[ids] = chunk.tokens[real]
    out.logprobs[ids] = chunk.logprobs[real]
    out.lengths[ids] = chunk.lengths[real]
    out.stopped[ids] = chunk.done[real]


def decode_chunk(decoder: Decoder, chunk: Chunk, sizes: list[int], n: int, check_every: int,
                 t_max: int, out: Results, buffers: Buffers) -> None:
    """Decode `chunk` until each row stops or has `t_max` tokens: `check_every` steps between
    host checks; at a check, stop when no row is live, compact to the smallest of `sizes` (the
    buckets) holding the live rows when it is smaller than the chunk (its fillers: stopped rows,
    earliest first, gathered into the first rows of `buffers`); at the end write the rows into
    `out`."""
    steps = 0
    decoder.bind(chunk)
    while steps < t_max:
        for _ in range(min(check_every, t_max - steps)):
            if not decoder.compiled:
                chunk.cache.limit = chunk.cache.offset + steps + 1
            decoder.run(chunk)
            steps += 1
        if steps == t_max:
            break
        live = ~chunk.done
        count = int(live.sum())  # the host sync of the stop check, once every `check_every`
        if count == 0:
            break
        bucket = fit_bucket(sizes, count)
        if bucket < chunk.rows:
            write_back(chunk, out)
            order = torch.argsort((~live).to(torch.int8), stable=True)  # live rows first
            keep = order[:bucket].sort().values
            chunk = chunk.select(keep, min(bucket, n), buffers)
            decoder.bind(chunk)
    write_back(chunk, out)
