"""Where the gap between KV-injected and pasted answers lives: probes beyond the product's settings, and the product.

Issue #10 asks KV-injected answers to be as good as pasted ones. With the default (w=5, pure injection) the
first-token KL(prompt || kv) is 0.046-0.062 nats on the LoCoMo slices, against 0.014-0.019 for prompt mode against
itself with the memories reversed, and recompute within 15% of the memory tokens moves it by 0.005-0.011
(docs/architecture.md, runs 2, 3 and 5). These probes ask where the rest lives. Each is measured on the cases
``inferscale eval fidelity`` builds (the same memories in the same order), first token only, against prompt mode:

- ``band``: the memory tokens recomputed, with causal attention over the whole memory segment, in a band of layers
  only; the other layers keep the injected K/V. ``top:n`` recomputes the last n layers, starting from the hidden
  states each fact's tokens had at that layer's input in their own encoding pass (after the system prefix and their
  w context turns); ``bottom:n`` recomputes the first n layers from the token embeddings. A band of n layers costs
  n / L of prompt mode's memory prefill. Checks, printed: ``top:0`` equals KV mode and ``top:L`` prompt mode.
- ``chain:w``: each memory encoded on top of the *stored K/V* of its last w context turns, injected after the
  system prefix as a chat injects them (the turns' own chained K/V, in conversation order), instead of after the
  turns' text: only the memory's own tokens are prefilled (counted, as the windowed encoding's tokens are). With
  ``--chain-blocks B`` every B-th memory is an anchor, encoded as the product encodes it (after its turns' text), and
  the others chain only on memories of their own block: re-wording or deleting one memory then changes the K/V of
  at most B - 1 others, where a chain through the whole conversation changes every later memory's.
- ``product``: the product itself, for each ``--product-blocks B`` (``kv.chain_block``; 0: no chains): a
  :class:`~inferscale.MemoryClient` on the probe's engine adds every memory on its own, in conversation order
  (``add(infer=False)``, eager encoding), so each memory's context is its scope's last memories across sessions (the
  other probes use the turns before it in its session), and each case is served the K/V the client stores
  (``memory_kv``). Its cost counts what the stored contexts make the encoder prefill. Its clients run with
  ``kv.first_memory_context_free``, so each memory is stored twice: its row serves every memory from its
  context-window encoding, and a row more (``first context-free``) serves each case's first memory from its
  context-free one, as the product then does (the cost of the second encoding counted in that row).
- ``layout``: the facts served away from their contiguous slots' positions (cache slots stay contiguous, position
  ids do not): ``overlap`` puts each fact exactly at the position it was encoded at (after the prefix and its
  context), so facts with contexts of similar length overlap; ``gaps`` puts each at that position or right after the
  fact before it, whichever is later (with w=5 contexts longer than the facts before them, mostly one gap before the
  first fact: the segment shifted away from the prefix).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gap_probes.py --locomo ../shared/data/locomo/locomo10.json

Prints one row per probe setting: mean KL (nats), first-token agreement and the probe's cost (the layers a band
recomputes; the tokens an encoding prefills for the conversation's memories, the cached system prefix not counted).
It checks its own plumbing as it goes and stops at the first check off by more than 1e-4: a band of no layer is KV
mode and a band of every layer prompt mode (in any logit); the hidden states a top band starts from give, through
that layer's key projection, the stored facts' pre-RoPE keys; the contiguous layout is KV mode (in any logit); an
anchor's K/V are the default's.
With ``--max-new-tokens N`` it also decodes greedy answers of up to N tokens in prompt mode, the default and each
chain, and prints a line more for each with ``inferscale eval fidelity``'s answer figures: F1 between the kv and
prompt answers and against gold, budget hits and repeats (the bands and layouts stay first-token probes).
SmolLM2-135M-Instruct (embedded) in float32; ~25 minutes for the default bands on 40 questions, ~10 for the chains,
~2 for the layouts, on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from locomo_probe import add_slice_arguments, answer_line, dynamic_cache, float32_engine
from transformers import DynamicCache

from inferscale import MemoryClient, MemoryConfig
from inferscale.chains import ChainLink
from inferscale.cli_options import non_negative_int
from inferscale.config import KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import (
    SYSTEM_PROMPTS,
    FactCache,
    FidelitySetting,
    first_token_row,
    kv_answer_fields,
    prompt_reference,
    summarize_rows,
)
from inferscale.eval.fidelity_cases import FidelityCase, locomo_conversation, memories_with_contexts, retrieve_cases
from inferscale.kv.compose import assemble
from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.retrieval import Embedder
from inferscale.retrieval.embedder import SentenceTransformerEmbedder


class Probe:
    """The probes' forward passes, on one engine (its system prompt) and its model."""

    def __init__(self, engine: TransformersEngine, model: Any) -> None:
        self.engine, self.model = engine, model
        self.layers = model.model.layers
        self.prefix = engine.prefix_kv
        self.p = self.prefix.n_tokens

    def query_logits(self, cache: DynamicCache, case: FidelityCase, start: int) -> torch.Tensor:
        """``[vocab]`` float32: the first answer token's logits after the query is prefilled on ``cache`` from
        position ``start``."""
        ids = self.engine.conversation_token_ids(case.question)
        out = self.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(start, start + len(ids))[None],
            cache=cache,
            use_cache=True,
        )
        return out.logits[0, -1].float()

    def run_layers(self, hidden: torch.Tensor, cache: DynamicCache, layers: range) -> None:
        """Run ``hidden`` (``[1, S, hidden_size]``, the memory tokens) through ``layers`` at positions ``P ..
        P+S-1``, each token attending causally to the prefix and the memory tokens before it; the layers write
        their K/V into ``cache``."""
        s = hidden.shape[1]
        positions = torch.arange(self.p, self.p + s)[None]
        rotary = self.model.model.rotary_emb(hidden, positions)
        mask = torch.zeros((s, self.p + s))
        mask[:, self.p :] = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)
        for i in layers:
            out = self.layers[i](
                hidden,
                attention_mask=mask[None, None],
                position_ids=positions,
                cache=cache,
                use_cache=True,
                position_embeddings=rotary,
            )
            hidden = out[0] if isinstance(out, tuple) else out

    def band_logits(
        self, case: FidelityCase, facts: Sequence[FactKV], hidden: list[list[torch.Tensor]], band: str
    ) -> torch.Tensor:
        """KV mode with the memory tokens recomputed in a band of layers (``"top:n"`` or ``"bottom:n"``).

        ``hidden[i][l]``: fact i's tokens' hidden states at layer l's input in its encoding pass, ``[n_i, hidden]``.
        """
        side, n = parse_band(band, len(self.layers))
        total = len(self.layers)
        recomputed = range(total - n, total) if side == "top" else range(n)
        segment = assemble(self.prefix, facts, self.engine.rope_table)
        data = []
        for i in range(total):
            kv = (self.prefix.keys, self.prefix.values) if i in recomputed else (segment.keys, segment.values)
            data.append((kv[0][i][None].clone(), kv[1][i][None].clone()))
        cache = DynamicCache(ddp_cache_data=data, config=self.model.config)
        if recomputed:
            if side == "top":
                start = torch.cat([h[recomputed.start] for h in hidden])[None]
            else:
                start = self.model.model.embed_tokens(segment.token_ids[self.p :][None])
            self.run_layers(start, cache, recomputed)
        return self.query_logits(cache, case, segment.n_tokens)

    def encoding_hidden_states(self, case: FidelityCase, w: int) -> list[list[torch.Tensor]]:
        """Each fact's tokens' hidden states at every layer's input (index l: layer l's input; the last entry is the
        final norm's output), from a plain pass over ``[system prefix][its last w context turns][fact]``."""
        out = []
        for i, text in enumerate(case.memories):
            ids = self.engine.fact_token_ids(text)
            context = self.engine.context_token_ids(case.context_of(i)[-w:] if w else [])
            prompt = self.engine.system_prefix_ids() + context + ids
            run = self.model.model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
            out.append([h[0, -len(ids) :] for h in run.hidden_states])
        return out

    def gapped_logits(self, case: FidelityCase, facts: Sequence[FactKV], starts: Sequence[int]) -> torch.Tensor:
        """KV mode with fact i's first token at position ``starts[i]`` (cache slots stay contiguous)."""
        table = self.engine.rope_table
        keys = [self.prefix.keys, *[table.rotate(f.keys, start=s) for f, s in zip(facts, starts, strict=True)]]
        values = [self.prefix.values, *[f.values for f in facts]]
        k, v = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        cache = dynamic_cache(k, v, self.model.config)
        end = max(s + f.n_tokens for f, s in zip(facts, starts, strict=True))
        return self.query_logits(cache, case, end)

    @torch.inference_mode()
    def chain_encode(
        self, memories: Sequence[str], context_of: dict[str, list[str]], w: int, block: int, anchor_window: int
    ) -> tuple[dict[str, FactKV], int]:
        """Every memory, in conversation order, encoded on top of the chained K/V of the context turns
        :func:`chain_context` gives it (injected after the system prefix, oldest first). With ``block`` = B > 0
        every B-th memory is an *anchor*: encoded as the product encodes it, after the text of its last
        ``anchor_window`` context turns, so no chain runs across an anchor. Returns each memory's pre-RoPE K/V and
        the tokens prefilled (the anchors' context turns included, the cached system prefix not). A chained memory is
        encoded by the product's chained encoding (:attr:`inferscale.kv.encode.EncodeRequest.chained_on`)."""
        chained: dict[str, FactKV] = {}
        index = {text: i for i, text in enumerate(memories)}
        prefix_ids = self.engine.system_prefix_ids()
        prefilled = 0
        for i, text in enumerate(memories):
            ids = self.engine.fact_token_ids(text)
            anchor, before = chain_context(i, [index[t] for t in context_of[text]], w, block)
            if anchor:
                turns = self.engine.context_token_ids(context_of[text][-anchor_window:])
                request = EncodeRequest(ids, context_ids=prefix_ids + turns)
                prefilled += len(turns) + len(ids)
            else:  # the product's chained encoding: the fact's tokens on the prefix and the chained facts' K/V
                request = EncodeRequest(ids, context_ids=prefix_ids, chained_on=[chained[memories[j]] for j in before])
                prefilled += len(ids)
            chained[text] = self.engine.encode_facts([request])[0]
        return chained, prefilled

    def stored_key_error(self, facts: Sequence[FactKV], hidden: list[list[torch.Tensor]], layer: int) -> float:
        """Largest |Δ| between the stored facts' pre-RoPE keys at ``layer`` and what that layer's key projection
        makes of ``hidden[i][layer]`` (fact i's hidden states at the layer's input in its encoding pass): whether
        the hidden states a top band starts from are the ones the stored K/V came from (Llama-style layers:
        ``input_layernorm`` then ``self_attn.k_proj``, as SmolLM2's)."""
        block = self.layers[layer]
        worst = 0.0
        for fact, states in zip(facts, hidden, strict=True):
            keys = block.self_attn.k_proj(block.input_layernorm(states[layer]))  # [n_i, n_kv * head_dim]
            n_kv, n, head_dim = fact.keys.shape[1:]
            keys = keys.view(n, n_kv, head_dim).transpose(0, 1)  # [n_kv, n_i, head_dim]
            worst = max(worst, float((keys - fact.keys[layer]).abs().max()))
        return worst


def parse_band(band: str, n_layers: int | None = None) -> tuple[str, int]:
    """``"top:n"`` or ``"bottom:n"`` → ``(side, n)``.

    Raises:
        ValueError: for another side, or n outside ``0 .. n_layers`` (``n_layers=None``: any n >= 0).
    """
    side, _, count = band.partition(":")
    if side not in ("top", "bottom") or not count.isdigit() or (n_layers is not None and int(count) > n_layers):
        bound = "N >= 0" if n_layers is None else f"0 <= N <= {n_layers}"
        raise ValueError(f"band {band!r}: expected 'top:N' or 'bottom:N' with {bound}")
    return side, int(count)


def band_argument(text: str) -> str:
    """``--bands`` items: ``top:N`` or ``bottom:N`` (the layer count is checked once the model is loaded)."""
    try:
        parse_band(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text


def window_argument(text: str) -> int:
    """``--chain-windows`` items: a context window w >= 1 (w=0 would be pure injection, not a chain)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a window w >= 1")
    return int(text)


def is_anchor(i: int, block: int) -> bool:
    """Whether memory ``i`` (0-based, in storage order) anchors a bounded chain of blocks of ``block`` memories (none
    does when ``block`` is 0)."""
    return block > 0 and i % block == 0


def chain_context(i: int, context: Sequence[int], w: int, block: int = 0) -> tuple[bool, list[int]]:
    """Memory ``i``'s (0-based, in storage order) place in a chain of window ``w``: whether it is an anchor (encoded
    after the text of its context turns, never on stored K/V), and the indices of the memories whose chained K/V it
    is encoded on: of its last ``w`` context turns (``context``: their memories' indices, oldest first), those its
    chain reaches. ``block`` = B > 0 makes memories 0, B, 2B, ... anchors, and a chain never reaches back past its
    block's anchor, so re-wording or deleting a memory changes the K/V of at most the B - 1 memories after it; with
    ``block`` = 0 the chain runs through the whole scope (its first memory is encoded alone).

    Raises:
        ValueError: when ``w`` is under 1, or a context turn is not a memory stored before ``i``.
    """
    if w < 1:
        raise ValueError(f"a chain's window must be at least 1, got {w}")
    if any(j < 0 or j >= i for j in context):
        raise ValueError(f"memory {i}'s context turns must be memories stored before it, got {list(context)}")
    if is_anchor(i, block):
        return True, []
    start = i - i % block if block else 0
    return False, [j for j in context[-w:] if j >= start]


def contiguous_starts(p: int, facts: Sequence[FactKV]) -> list[int]:
    """Where each fact starts when laid out one after the other from position ``p`` (as the product serves)."""
    starts, position = [], p
    for fact in facts:
        starts.append(position)
        position += fact.n_tokens
    return starts


def gapped_starts(p: int, facts: Sequence[FactKV]) -> list[int]:
    """Each fact at its encoded position or right after the fact before it, whichever is later."""
    starts, end = [], p
    for fact in facts:
        starts.append(max(fact.encoded_at, end))
        end = starts[-1] + fact.n_tokens
    return starts


def product_encode(
    engine: TransformersEngine, embedder: Embedder, memories: Sequence[str], system_prompt: str, block: int
) -> tuple[dict[str, FactKV], dict[str, FactKV], int, int]:
    """Every memory added on its own, in order, by a client with ``kv.chain_block`` = ``block`` and
    ``kv.first_memory_context_free`` (every other setting at its default) on ``engine``, in a temporary data
    directory.

    Returns:
        Each memory's K/V as the client serves it in any slot but the first (its context-window encoding) and in the
        first (its context-free one), both as stored, by text; the tokens the encoder prefills for the first
        (each memory's tokens, and the text of the context turns of those not chained; the cached system prefix not)
        and for the second (each memory's tokens again, where it has turns or a chain).
    """
    kv = KVConfig(chain_block=block, first_memory_context_free=True, encode_on_add="eager")
    with tempfile.TemporaryDirectory() as data_dir:
        config = MemoryConfig(data_dir=data_dir, system_prompt=system_prompt, kv=kv)
        with MemoryClient(config, engine=engine, embedder=embedder) as client:
            stored = []
            for text in memories:
                (added,) = client.add([{"role": "user", "content": text}], user_id="probe", infer=False)["results"]
                record = client.db.get(added["id"])
                if record is None:  # nothing else writes to the probe's own data directory
                    raise SystemExit(f"the memory {text!r} was added but is not stored")
                stored.append(record)
            # Served after a first memory, each is served from its context-window encoding (the first memory
            # added has no turns: its one encoding serves both); served first, from its context-free one.
            in_context = dict(zip(memories, client.memory_kv([stored[0], *stored])[1:], strict=True))
            context_free = {text: client.memory_kv([record])[0] for text, record in zip(memories, stored, strict=True)}
    window = config.kv.context_window
    prefilled = second = 0
    for record in stored:
        fact = len(engine.fact_token_ids(record.text))
        prefilled += fact
        chained = bool(block and ChainLink.of(record).chained)
        turns = len(engine.context_token_ids(record.context[-window:])) if window and record.context else 0
        prefilled += 0 if chained else turns
        second += fact if chained or turns else 0
    return in_context, context_free, prefilled, second


PROBES = ("band", "chain", "product", "layout")
CHECK_TOLERANCE = 1e-4
"""The largest |Δ| a plumbing check allows, in a logit or a pre-RoPE key (float32 kernels' rounding is ~1e-5)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_slice_arguments(parser)
    parser.add_argument("--system-prompt", default="default", choices=sorted(SYSTEM_PROMPTS))
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES, help="which probes (default all)")
    parser.add_argument(
        "--bands",
        nargs="+",
        type=band_argument,
        default=["top:4", "top:8", "top:15", "bottom:4"],
        help="layer bands (default %(default)s)",
    )
    parser.add_argument(
        "--chain-windows", nargs="+", type=window_argument, default=[1, 3, 5], help="w of the chains (default 1 3 5)"
    )
    parser.add_argument(
        "--chain-blocks",
        nargs="+",
        type=non_negative_int,
        default=[0],
        help="B of the chains: every B-th memory an anchor encoded after its turns' text, no chain reaching past "
        "one (default 0: one chain through the conversation)",
    )
    parser.add_argument(
        "--product-blocks",
        nargs="+",
        type=non_negative_int,
        default=[0, 24],
        help="kv.chain_block of the product probe's clients (default 0 24: without chains, and B=24)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=non_negative_int,
        default=0,
        help="also decode greedy answers of up to N tokens for prompt mode, the default and the chains, and report "
        "their F1 and budget hits as `inferscale eval fidelity` does (default 0: first token only)",
    )
    args = parser.parse_args()
    probes = set(args.probes)

    engine, model = float32_engine(args.system_prompt)
    n_layers = len(model.model.layers)
    bands: list[str] = args.bands if "band" in probes else []
    for band in bands:
        try:
            parse_band(band, n_layers)
        except ValueError as error:  # the layer count is known now, before any case is built
            parser.error(f"--bands: {error}")
    windows: list[int] = args.chain_windows if "chain" in probes else []
    probe = Probe(engine.load(), model)
    default = FidelitySetting(first_memory_context_free=False)  # w=5 in every slot: what the bands start from
    stored = FactCache(engine)
    sessions, questions = locomo_conversation(args.locomo, args.conversation, args.questions)
    memories, contexts = memories_with_contexts(sessions, across_sessions=False)  # as the runs before 23 measured
    embedder = SentenceTransformerEmbedder(None, "cpu")
    cases = retrieve_cases(args.conversation, memories, questions, args.k, embedder, contexts).cases

    fact_tokens = sum(len(engine.fact_token_ids(m)) for m in memories)

    def windowed_tokens(w: int) -> int:
        """Tokens the product's encoding prefills for the conversation's memories at context window w."""
        return fact_tokens + sum(len(engine.context_token_ids(c[-w:] if w else [])) for c in contexts)

    w = default.context_window
    label = f"default (w={w}, pure injection)"
    costs = {label: f"encoding prefills {windowed_tokens(w) / fact_tokens:.2f}x fact tokens"}
    for band in bands:
        n = parse_band(band, n_layers)[1]
        costs[f"band {band}"] = f"{n}/{n_layers} layers = {n / n_layers:.0%} of the memory prefill"
    chains: dict[str, tuple[int, dict[str, FactKV]]] = {}
    context_of = dict(zip(memories, contexts, strict=True))
    stored_at = {text: i for i, text in enumerate(memories)}
    for window in windows:
        for block in args.chain_blocks:
            name = f"chain:{window}" + (f", anchors every {block}" if block else "")
            encoded, prefilled = probe.chain_encode(memories, context_of, window, block, w)
            chains[name] = (block, encoded)
            costs[name] = (
                f"encoding prefills {prefilled / fact_tokens:.2f}x fact tokens "
                f"(text, w={window}: {windowed_tokens(window) / fact_tokens:.2f}x)"
            )
    products: dict[str, tuple[dict[str, FactKV], dict[str, FactKV] | None]] = {}
    for block in args.product_blocks if "product" in probes else []:
        name = f"product, chain_block={block}"
        prompt_text = SYSTEM_PROMPTS[args.system_prompt]
        in_context, context_free, prefilled, second = product_encode(engine, embedder, memories, prompt_text, block)
        products[name] = (in_context, None)
        products[f"{name}, first context-free"] = (in_context, context_free)
        costs[name] = f"encoding prefills {prefilled / fact_tokens:.2f}x fact tokens"
        costs[f"{name}, first context-free"] = (
            f"encoding prefills {(prefilled + second) / fact_tokens:.2f}x fact tokens"
        )
    if "layout" in probes:
        costs |= {"layout: gaps": "0", "layout: overlap": "0"}

    rows: list[dict[str, Any]] = []
    checks: dict[str, float] = {}
    budget = args.max_new_tokens

    def record(name: str, reference: torch.Tensor, logits: torch.Tensor, served: Sequence[FactKV] = ()) -> None:
        """One row, in ``inferscale eval fidelity``'s fields; with ``served`` and a budget, also the greedy answer
        decoded on those facts' K/V against prompt mode's (``answer`` below)."""
        row = first_token_row(name, reference, logits, sum(f.n_tokens for f in served), case)
        if served and budget:
            row |= kv_answer_fields(engine.generate_kv(case.question, list(served), budget), answer, budget)
        rows.append(row)

    def check(name: str, delta: float) -> None:
        """Keep the largest ``delta`` of a check; stop at once when it is over :data:`CHECK_TOLERANCE`."""
        checks[name] = max(checks.get(name, 0.0), delta)
        if delta > CHECK_TOLERANCE:
            raise SystemExit(f"plumbing check {name!r} off by {delta:.2e} (> {CHECK_TOLERANCE:g}) on {case.question!r}")

    def max_delta(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got - want).abs().max())

    with torch.inference_mode():
        for case in cases:
            prompt = prompt_reference(engine, case, budget, generate=budget > 0)
            reference, answer = prompt["logits"], prompt.get("generation")
            facts = stored.get(case, default)
            kv = engine.first_token_logits(case.question, facts)
            record(label, reference, kv, facts)
            if bands:
                hidden = probe.encoding_hidden_states(case, default.context_window)
                check("band top:0 = KV mode", max_delta(probe.band_logits(case, facts, hidden, "top:0"), kv))
                every = probe.band_logits(case, facts, hidden, f"top:{n_layers}")
                check(f"band top:{n_layers} = prompt mode", max_delta(every, reference))
                for layer in sorted({n_layers - parse_band(b)[1] for b in bands if b.startswith("top:")} - {n_layers}):
                    check(f"hidden states at layer {layer} = stored keys", probe.stored_key_error(facts, hidden, layer))
                for band in bands:
                    record(f"band {band}", reference, probe.band_logits(case, facts, hidden, band))
            for name, (block, chained) in chains.items():
                served = [chained[t] for t in case.memories]
                for text, fact, got in zip(case.memories, facts, served, strict=True):
                    if is_anchor(stored_at[text], block):
                        delta = max(max_delta(got.keys, fact.keys), max_delta(got.values, fact.values))
                        check("anchor K/V = the default's", delta)
                record(name, reference, engine.first_token_logits(case.question, served), served)
            for name, (in_context, context_free) in products.items():
                served = [in_context[t] for t in case.memories]
                if context_free is not None and served:
                    served[0] = context_free[case.memories[0]]
                record(name, reference, engine.first_token_logits(case.question, served), served)
            if "layout" in probes:
                laid = probe.gapped_logits(case, facts, contiguous_starts(probe.p, facts))
                check("contiguous layout = KV mode", max_delta(laid, kv))
                layouts = {
                    "layout: gaps": gapped_starts(probe.p, facts),
                    "layout: overlap": [f.encoded_at for f in facts],
                }
                for name, starts in layouts.items():
                    record(name, reference, probe.gapped_logits(case, facts, starts))

    title = f"{args.conversation}, {len(cases)} questions, k={args.k}, {args.system_prompt} system prompt, float32"
    print(title)
    summaries = summarize_rows(rows, by=("setting",))
    for summary in summaries:
        name = summary.setting
        print(f"{name:<32} KL {summary.kl_mean:.4f}  agree {summary.top1_agreement:.3f}  cost: {costs[name]}")
    answered = {row["setting"] for row in rows if "kv_answer" in row}
    for s in summaries:
        if s.setting in answered:
            print(answer_line(s, budget))
    for name, delta in checks.items():
        print(f"check {name}: max |Δ| {delta:.1e}")


if __name__ == "__main__":
    main()
