"""Recipe `3vl-coco`: 3VL (docs/methods.md §3; paper Tables I-III) on COCO and the real
compositional benchmarks, for an OpenCLIP model.

    vlctl reproduce 3vl-coco --encoder open_clip:ViT-B-32/openai --coco-root coco/ --coco-annotations dataset_coco.json \\
        --vl-checklist-root vl_checklist_images/ --vl-checklist-attribute data/Attribute/vg/color.json ... \\
        --sugarcrepe-root coco/val2017 --sugarcrepe replace_att.json swap_obj.json --aro-root vg/ \\
        --aro-relation visual_genome_relation.json --out runs/3vl-coco

Stages: trees (3VL caption trees and NegCLIP one-word negatives of the COCO train captions) ->
finetune-<mode> for mode in contrastive, negclip, tree (rank-1 LoRA through peft on the same
data, steps and ranks; the paper's defaults: lr 3e-6, wd 0.1, batch 64, 12 epochs, alpha 0.5;
resumable after a kill) -> evaluate (VL-CheckList Attribute / Relation / Object, SugarCrepe, ARO,
COCO T->I R@1, failures per POS of the replaced word, the tree model with Anchor token removal
at 65%) -> report. Under torchrun (`vlctl.recipes.runner`) the fine-tunings train DDP, the
trees and the evaluation run on rank 0.

results.json has the keys of 3vl-scenes (checklist.{category: {model: acc}, average},
n_items, failures_by_pos, n_items_by_pos, token_removal, fine_tuning, trees, paper, timings),
plus sugarcrepe, aro and coco_t2i_r1.
"""

from __future__ import annotations

import dataclasses
import difflib
import shutil
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_save_safetensors, atomic_write_json, read_json
from vlctl.recipes.real_common import (
    EncoderRun,
    LazyEncoder,
    data_hash,
    estimate_line,
    is_main_rank,
    is_random,
    rank_device,
    report_header,
    say_main,
)
from vlctl.recipes.real_data import ThreeVLCocoData, flag, need_dir, need_file
from vlctl.recipes.runner import Runner
from vlctl.recipes.threevl.coco_model import base_encoder, clip_forward, fresh_model, lora_kind, tuned_encoder
from vlctl.report.writer import Report

# 3VL paper (CLIP ViT-B/32): VL-CheckList (Tables I-III), COCO T->I R@1.
PAPER = {
    "checklist_avg": {"base": 66.13, "negclip": 69.75, "tree": 78.25, "tree_anchor_tr": 79.18},
    "object_avg": {"base": 79.01, "contrastive": 81.18, "negclip": 81.54, "tree": 89.28},
    "coco_t2i_r1": {"base": 28.66, "tree": 36.54},
    "pos_failure_reduction_vs_base": {"VERB": 51.6, "ADP": 46.2},
}
FT_MODES = ("contrastive", "negclip", "tree")
MODELS = ("base", *FT_MODES, "tree_anchor_tr")
CHECKLIST = ("attribute", "relation", "object")
POS_TAGS = ("NOUN", "ADJ", "ADP", "VERB")


@dataclasses.dataclass(frozen=True)
class ThreeVLCocoRecipe:
    rank: int = opt(1, "LoRA rank (paper: 1)", ge=1, le=1024)
    lora_alpha: float = opt(1.0, "LoRA alpha (update scaled by alpha / rank)", gt=0, le=10_000)
    lr: float = opt(3e-6, "adapter learning rate (paper: 3e-6)", gt=0, le=10)
    weight_decay: float = opt(0.1, "AdamW weight decay (paper: 0.1)", ge=0, le=10)
    batch_size: int = opt(64, "batch size (paper: 64)", ge=1, le=65536)
    epochs: int = opt(12, "epochs over the COCO train captions (paper: 12)", ge=1, le=100_000)
    warmup_steps: int = opt(50, "linear warmup steps", ge=0, le=10**9)
    alpha: float = opt(0.5, "weight of L_tree in alpha L_tree + (1 - alpha) L_contrast (paper: 0.5)", ge=0, le=1)
    level_reduction: str = opt("sum", "tree levels summed (paper) or averaged", choices=("sum", "mean"))
    max_levels: int = opt(8, "tree levels kept per caption (the finest)", ge=1, le=1000)
    max_negatives: int = opt(8, "negatives kept per tree level", ge=1, le=1000)
    max_train_captions: int = opt(0, "use the first N COCO train captions only (0 = all)", ge=0, le=10**10)
    stop_after_steps: int = opt(0, "end each fine-tune after this many steps, its schedule still the epochs' "
                                   "(0 = every epoch): a smoke test or rehearsal of the whole data at a few steps",
                                ge=0, le=10**9)
    removal_fraction: float = opt(0.65, "Anchor token removal: fraction of patches removed (paper: 65%)", ge=0, lt=1)
    checkpoint_every: int = opt(500, "fine-tuning checkpoint every this many steps (resume after a kill)", ge=0,
                                le=10**9)
    seed: int = opt(0, "seed of trees, negatives, adapters and data order", ge=0, le=2**32 - 1)


def load_preset(quick: bool) -> ThreeVLCocoRecipe:
    path = Path(__file__).with_name("3vl-coco.json")
    return config_from_dict(ThreeVLCocoRecipe, read_json(path)["quick" if quick else "full"], source=str(path))


# --- data ----------------------------------------------------------------------------------------


def _coco(data: ThreeVLCocoData, split: str):
    from vlctl.data.loaders.retrieval import load_karpathy

    ann = need_file(data.coco_annotations, flag("coco_annotations"), "coco")
    return load_karpathy(ann, split=split, root=need_dir(data.coco_root, flag("coco_root"), "coco")), ann


def _benchmarks(data: ThreeVLCocoData) -> dict[str, dict[str, list]]:
    """{"checklist": {category: items}, "sugarcrepe": {file stem: items}, "aro": {name: items}}."""
    from vlctl.data.loaders.compositional import load_aro, load_sugarcrepe, load_vl_checklist

    out: dict[str, dict[str, list]] = {"checklist": {}, "sugarcrepe": {}, "aro": {}}
    for c in CHECKLIST:
        files = getattr(data, f"vl_checklist_{c}")
        if files:
            root = need_dir(data.vl_checklist_root, flag("vl_checklist_root"), "vl_checklist")
            out["checklist"][c] = [(it, root) for f in files
                                   for it in load_vl_checklist(need_file(f, flag(f"vl_checklist_{c}"), "vl_checklist"),
                                                               root=root)[0]]
    for f in data.sugarcrepe:
        root = need_dir(data.sugarcrepe_root, flag("sugarcrepe_root"), "sugarcrepe")
        out["sugarcrepe"][Path(f).stem] = [(it, root) for it in load_sugarcrepe(
            need_file(f, flag("sugarcrepe"), "sugarcrepe"), root=root)[0]]
    for name in ("relation", "attribution"):
        f = getattr(data, f"aro_{name}")
        if f:
            root = need_dir(data.aro_root, flag("aro_root"), "aro")
            out["aro"][f"vg_{name}"] = [(it, root) for it in load_aro(need_file(f, flag(f"aro_{name}"), "aro"),
                                                                        root=root)[0]]
    if not any(out.values()):
        raise VlctlError(f"3vl-coco: no benchmark given; pass VL-CheckList ({flag('vl_checklist_attribute')} ...), "
                         f"SugarCrepe ({flag('sugarcrepe')}) or ARO ({flag('aro_relation')}) files")
    return out


# --- stages --------------------------------------------------------------------------------------


TREE_CHUNK = 20_000  # unique captions per saved chunk of the trees stage (minutes of parsing each)


def _trees(cfg: ThreeVLCocoRecipe, captions: list[str], work: Path, resume: bool = False) -> None:
    """trees.json: each caption's tree and NegCLIP negative. The unique captions are parsed
    `TREE_CHUNK` at a time, each chunk saved under `checkpoint/` with a state.json naming the chunks
    done, so a stage killed after hours of COCO's 566k captions goes on at its first unsaved chunk
    (a caption's tree and negative depend on it and the seed alone, so the chunks change nothing)."""
    from vlctl.captions.trees import TreeGenerator

    gen = TreeGenerator(seed=cfg.seed)
    uniq = sorted(set(captions))
    ck, n_chunks = work / "checkpoint", max(1, -(-len(uniq) // TREE_CHUNK))
    state = read_json(ck / "state.json", "trees checkpoint") if resume else {}
    done = state.get("chunks", 0) if (state.get("of"), state.get("n_unique")) == (n_chunks, len(uniq)) else 0
    if done:
        say_main(f"stage trees: {done} of {n_chunks} chunks parsed before the kill; going on from there")
    else:
        gen.trees(uniq[:1], errors="skip")  # loads spaCy and WordNet: the estimate is the parsing rate alone
        t0 = time.perf_counter()
        probe = uniq[: min(64, len(uniq))]
        gen.trees(probe)
        estimate_line("stage trees", len(uniq), len(probe) / max(time.perf_counter() - t0, 1e-9), 0, unit="captions")
    for c in range(done, n_chunks):
        part = uniq[c * TREE_CHUNK:(c + 1) * TREE_CHUNK]
        t0 = time.perf_counter()
        # A caption the generator cannot parse gets no tree (only its whole-caption level in training).
        trees = gen.trees(part, errors="skip")
        seconds = time.perf_counter() - t0
        negs = gen.random_negatives(part, seed=cfg.seed, errors="skip")
        atomic_write_json(ck / f"chunk-{c:05d}.json", {"trees": trees, "negatives": [n and n[0] for n in negs],
                                                       "seconds": seconds})
        atomic_write_json(ck / "state.json", {"chunks": c + 1, "of": n_chunks, "n_unique": len(uniq)})
        if n_chunks > 1:
            say_main(f"stage trees: chunk {c + 1}/{n_chunks} parsed ({min((c + 1) * TREE_CHUNK, len(uniq))} of "
                     f"{len(uniq)} captions)")
    chunks = [read_json(ck / f"chunk-{c:05d}.json", "trees checkpoint") for c in range(n_chunks)]
    trees = dict(zip(uniq, (t for ch in chunks for t in ch["trees"])))
    negs = dict(zip(uniq, (n for ch in chunks for n in ch["negatives"])))
    atomic_write_json(work / "trees.json", {"trees": [trees[c] or [] for c in captions],
                                            "negatives": [negs[c] for c in captions],
                                            "seconds": sum(ch["seconds"] for ch in chunks), "n_unique": len(uniq)})
    shutil.rmtree(ck)  # trees.json replaces the chunks


def _finetune(cfg: ThreeVLCocoRecipe, mode: str, lazy: LazyEncoder, run: EncoderRun, paths: list[Path],
              captions: list[str], image_of_text: np.ndarray, trees_dir: Path, work: Path, resume: bool) -> None:
    import torch

    from vlctl.encoders.open_clip_encoder import autocast_for
    from vlctl.images import read_image
    from vlctl.methods.threevl.lora import lora_parameters
    from vlctl.methods.threevl.tree_tune import contrastive_loss, negclip_loss, tree_loss, tree_tensors
    from vlctl.train.config import LoopConfig
    from vlctl.train.loop import train

    if run.precision == "fp16":
        raise VlctlError("3vl-coco: fine-tuning runs in fp32 or bf16 (fp16 without loss scaling underflows); "
                         "use --precision bf16")
    base = base_encoder(lazy)
    kind = lora_kind(base)
    model = fresh_model(lazy, cfg)
    t = read_json(trees_dir / "trees.json", "trees")
    tokenize = base.tokenize
    pos_tokens = tokenize(captions)
    device = torch.device("cuda:0" if rank_device(run.device) == "cuda" else rank_device(run.device))

    def make_batch(idx: np.ndarray, epoch: int):
        x = torch.stack([base.preprocess_pil(read_image(paths[image_of_text[i]])) for i in idx])
        batch = {"x": x, "pos": pos_tokens[torch.as_tensor(idx)]}
        if mode == "negclip":
            negs = [t["negatives"][i] for i in idx]
            batch["neg"] = tokenize([n if n is not None else captions[i] for n, i in zip(negs, idx)])
            batch["neg_ok"] = torch.tensor([n is not None for n in negs])
        elif mode == "tree":
            trees = [t["trees"][i] or [{"positive": captions[i], "negatives": []}] for i in idx]
            batch["tree"], batch["tree_mask"] = tree_tensors(trees, tokenize, cfg.max_levels, cfg.max_negatives,
                                                             cfg.seed + int(idx[0]))
        return batch

    def loss_fn(m, b):
        n = b["x"].shape[0]
        extra = b["neg"] if mode == "negclip" else b["tree"][b["tree_mask"]] if mode == "tree" else b["pos"][:0]
        with autocast_for(device, run.precision):
            img, txt, scale = clip_forward(m, kind, b["x"], torch.cat([b["pos"], extra]))
        img, txt = img.float(), txt.float()
        contrast = contrastive_loss(img, txt[:n], scale)
        if mode == "contrastive":
            return contrast
        if mode == "negclip":
            return negclip_loss(img, txt[:n], txt[n:], b["neg_ok"], scale)
        mask = b["tree_mask"]
        emb = torch.zeros(*mask.shape, img.shape[1], dtype=img.dtype, device=img.device)
        emb[mask] = txt[n:]
        lt = tree_loss(img, emb, mask, scale, cfg.level_reduction)
        return cfg.alpha * lt + (1 - cfg.alpha) * contrast, {"tree": float(lt.detach()),
                                                              "contrast": float(contrast.detach())}

    n = len(captions)
    loop = LoopConfig(epochs=cfg.epochs, batch_size=min(cfg.batch_size, n), lr=cfg.lr, weight_decay=cfg.weight_decay,
                      warmup_steps=cfg.warmup_steps, seed=cfg.seed, checkpoint_every=cfg.checkpoint_every,
                      progress=True, log_every=10)
    params = list(lora_parameters(model).values())
    groups = [{"params": params, "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
    run_config = {"mode": mode, "base": base.id, "config": config_to_dict(cfg), "precision": run.precision}
    per_epoch = max(1, n // loop.batch_size)
    steps = min(cfg.epochs * per_epoch, cfg.stop_after_steps) if cfg.stop_after_steps else cfg.epochs * per_epoch
    if not resume:  # time two steps on a scratch copy: the rate for the estimate line
        import shutil
        import tempfile

        probe_dir = Path(tempfile.mkdtemp(prefix="vlctl-3vl-probe-"))
        try:
            probe = fresh_model(lazy, cfg)
            r = train(probe, n_samples=n, make_batch=make_batch, loss_fn=loss_fn,
                      cfg=dataclasses.replace(loop, progress=False, checkpoint_every=0), out_dir=probe_dir,
                      param_groups=[{"params": list(lora_parameters(probe).values()), "lr": cfg.lr,
                                     "weight_decay": cfg.weight_decay}],
                      device=run.device, run_config=run_config, stop_after_steps=min(2, steps))
            rate = r.steps / max(r.seconds, 1e-9)
        finally:
            shutil.rmtree(probe_dir, ignore_errors=True)
        mem = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else \
            sum(p.numel() * p.element_size() for p in model.parameters())
        estimate_line(f"stage finetune-{mode}", steps, rate, mem, unit="steps")
    t0 = time.perf_counter()
    result = train(model, n_samples=n, make_batch=make_batch, loss_fn=loss_fn, cfg=loop, out_dir=work / "run",
                   param_groups=groups, resume=resume, device=run.device, run_config=run_config,
                   stop_after_steps=cfg.stop_after_steps or None)
    model.cpu()
    if not is_main_rank():  # under torchrun every rank trains (DDP); rank 0 writes
        return
    doc = {"format": "vlctl.lora-peft/1", "base_encoder_id": base.id,
           "mode": mode, "rank": cfg.rank, "alpha": cfg.lora_alpha}
    adapters = work / "adapters"
    atomic_save_safetensors(adapters / "adapters.safetensors",
                            {k: v.detach().clone().contiguous() for k, v in lora_parameters(model).items()})
    atomic_write_json(adapters / "adapter.json", doc)
    atomic_write_json(work / "fit.json", {"seconds": time.perf_counter() - t0, "steps": result.steps,
                                          "final_loss": result.final_loss, "steps_per_s": result.samples_per_s
                                          / loop.batch_size, "base_id": base.id})


# --- evaluation ----------------------------------------------------------------------------------


def _item_images(enc, items: list, run: EncoderRun) -> np.ndarray:
    """(n, d) embeddings of each item's image (ARO: cropped to its box), one forward per unique image."""
    import torch

    from vlctl.embeddings.extract import embed_image_files
    from vlctl.embeddings.extract_config import ExtractConfig
    from vlctl.images import read_image

    keys = [(str(root / it.image), it.box) for it, root in items]
    uniq = list(dict.fromkeys(keys))
    if all(box is None for _, box in uniq):
        res = embed_image_files(enc, [p for p, _ in uniq], ExtractConfig(batch_size=min(run.batch_size, 4096),
                                                                         workers=run.workers), progress=False)
        if res.failures:
            raise VlctlError(f"{len(res.failures)} benchmark image(s) could not be read: {res.failures[0]}")
        emb = res.embeddings
    else:
        rows = []
        for i in range(0, len(uniq), run.batch_size):
            x = torch.stack([enc.preprocess_pil(read_image(p).crop(box) if box else read_image(p))
                             for p, box in uniq[i:i + run.batch_size]])
            with torch.inference_mode():
                rows.append(enc.encode_images(x).float().cpu().numpy())
        emb = np.concatenate(rows)
    pos = {k: i for i, k in enumerate(uniq)}
    return emb[[pos[k] for k in keys]]


def _texts(enc, texts: list[str], run: EncoderRun) -> np.ndarray:
    from vlctl.embeddings.extract import embed_text_list

    out = np.zeros((len(texts), int(enc.embed_dim)), np.float32)
    embed_text_list(enc, texts, out, min(run.batch_size, 4096), progress=False)
    return out


def _scores(enc, items: list, run: EncoderRun) -> np.ndarray:
    """(n, 2) [cos(image, first positive), cos(image, first negative)]."""
    img = _item_images(enc, items, run)
    p = _texts(enc, [it.positives[0] for it, _ in items], run)
    n = _texts(enc, [it.negatives[0] for it, _ in items], run)
    return np.stack([(img * p).sum(1), (img * n).sum(1)], axis=1).astype(np.float64)


ANCHOR_FALLBACKS: list[str] = []  # pairs whose anchor fell back to "P or N" (reported in eval.json)


def _anchor(anchor_text, positive: str, negative: str) -> str:
    """3VL's anchor "AP or AN"; for a pair the anchor parser refuses (vlctl.captions.anchor checks
    that a text looks like English, and refuses e.g. VL-CheckList's 'teal knob'), the whole texts
    "P or N", which contain AP and AN."""
    try:
        return anchor_text(positive, negative)
    except VlctlError:
        ANCHOR_FALLBACKS.append(f"{positive} | {negative}")
        return f"{positive} or {negative}"


def _anchor_scores(enc, items: list, cfg: ThreeVLCocoRecipe, run: EncoderRun) -> np.ndarray:
    """Scores of the items' images re-encoded from the (1 - removal_fraction) most relevant patches
    by the Anchor map of "AP or AN"."""
    import torch

    from vlctl.captions.anchor import anchor_text
    from vlctl.images import read_image
    from vlctl.methods.threevl import relevancy as rel

    out = []
    for i in range(0, len(items), run.batch_size):
        chunk = items[i:i + run.batch_size]
        x = torch.stack([enc.preprocess_pil(read_image(root / it.image).crop(it.box) if it.box else
                                            read_image(root / it.image)) for it, root in chunk])
        anchors = [_anchor(anchor_text, it.positives[0], it.negatives[0]) for it, _ in chunk]
        maps = rel.anchor_map(enc, x, anchors)
        e = rel.remove_tokens(enc, x, maps, cfg.removal_fraction).float().detach().cpu().numpy()
        p = _texts(enc, [it.positives[0] for it, _ in chunk], run)
        n = _texts(enc, [it.negatives[0] for it, _ in chunk], run)
        out.append(np.stack([(e * p).sum(1), (e * n).sum(1)], axis=1))
    return np.concatenate(out).astype(np.float64)


def _replaced_pos(items: list) -> list[str | None]:
    """POS tag (spaCy, in the positive's context) of the word the negative replaces, None when the
    pair differs in more than one word."""
    from vlctl.captions.text import get_nlp

    nlp = get_nlp()
    out = []
    for it, _ in items:
        a, b = it.positives[0].split(), it.negatives[0].split()
        ops = [o for o in difflib.SequenceMatcher(a=a, b=b).get_opcodes() if o[0] != "equal"]
        if len(ops) != 1 or ops[0][2] - ops[0][1] != 1:
            out.append(None)
            continue
        word = a[ops[0][1]].strip(".,;:!?").lower()
        tag = next((t.pos_ for t in nlp(it.positives[0]) if t.text.lower() == word), None)
        out.append(tag)
    return out


def _evaluate(cfg, lazy: LazyEncoder, run: EncoderRun, ft_dirs: dict, bench: dict, coco_test, work: Path) -> None:
    from vlctl.eval.metrics import checklist_accuracy
    from vlctl.eval.retrieval import retrieval_recall

    encoders = {"base": base_encoder(lazy), **{m: tuned_encoder(lazy, cfg, ft_dirs[m] / "adapters", run)
                                                for m in FT_MODES}}
    arrays: dict[str, np.ndarray] = {}
    timings: dict[str, float] = {}
    groups = [(f"{kind}__{name}", items) for kind in ("checklist", "sugarcrepe", "aro")
              for name, items in bench[kind].items()]
    # The rate of the items' scoring, timed on the first group's first items with the base model.
    n_items = sum(len(items) for _, items in groups)
    probe = groups[0][1][: min(len(groups[0][1]), run.batch_size)]
    t0 = time.perf_counter()
    _scores(encoders["base"], probe, run)
    rate = len(probe) / max(time.perf_counter() - t0, 1e-9)
    n_anchor = sum(len(items) for g, items in groups if g.startswith("checklist__"))
    # 4 models score every item; Anchor maps (a backward pass per item, ~3 forwards) for 2 models.
    estimate_line("stage evaluate", 4 * n_items + 2 * 3 * n_anchor, rate,
                  sum(p.numel() * p.element_size() for p in encoders["base"].model.parameters()) * 4, unit="items")
    for model, enc in encoders.items():
        t0 = time.perf_counter()
        for g, items in groups:
            arrays[f"scores_{model}__{g}"] = _scores(enc, items, run)
        timings[f"{model}_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ANCHOR_FALLBACKS.clear()
    for g, items in groups:
        if g.startswith("checklist__"):
            arrays[f"scores_tree_anchor_tr__{g}"] = _anchor_scores(encoders["tree"], items, cfg, run)
            arrays[f"scores_base_anchor_tr__{g}"] = _anchor_scores(encoders["base"], items, cfg, run)
    timings["anchor_tr_s"] = time.perf_counter() - t0
    coco = None
    if coco_test is not None:
        coco = {}
        for model, enc in encoders.items():
            img = _item_images(enc, [(type("I", (), {"image": p, "box": None})(), coco_test.root)
                                     for p in coco_test.images], run)
            txt = _texts(enc, coco_test.captions, run)
            arrays[f"coco_image_emb_{model}"], arrays[f"coco_text_emb_{model}"] = img, txt
            coco[model] = retrieval_recall(img, txt, coco_test.image_of_text)["t2i@1"]
        arrays["coco_image_of_text"] = coco_test.image_of_text
    tags = {g: _replaced_pos(items) for g, items in groups}
    failures = {}
    for model in MODELS:
        counts = dict.fromkeys(POS_TAGS, 0)
        for g, _ in groups:
            key = f"scores_{model}__{g}"
            if key not in arrays:
                continue
            for tag, (sp, sn) in zip(tags[g], arrays[key]):
                if tag in counts and sp <= sn:
                    counts[tag] += 1
        failures[model] = counts
    n_by_pos = dict.fromkeys(POS_TAGS, 0)
    for g, _ in groups:
        for tag in tags[g]:
            if tag in n_by_pos:
                n_by_pos[tag] += 1
    acc = {k.removeprefix("scores_"): checklist_accuracy(v) for k, v in arrays.items() if k.startswith("scores_")}
    atomic_save_npz(work / "eval.npz", **arrays)
    atomic_write_json(work / "eval.json", {"accuracy": acc, "coco_t2i_r1": coco, "failures_by_pos": failures,
                                           "n_items_by_pos": n_by_pos, "timings": timings,
                                           "anchor_fallbacks": sorted(set(ANCHOR_FALLBACKS)),
                                           "encoder_ids": {m: e.id for m, e in encoders.items()}})


def run(out: Path, quick: bool = False, force: bool = False, stages=None, from_scratch: bool = False, *,
        encoder: str | None = None, data: ThreeVLCocoData | None = None, cfg: ThreeVLCocoRecipe | None = None,
        encoder_run: EncoderRun | None = None) -> Path:
    # No shipped checkpoints exist for the real recipes; from_scratch is passed on for the runner's contract.
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch,
                    device=(encoder_run or EncoderRun()).device, torchrun=True)
    if not encoder:
        raise VlctlError("3vl-coco: --encoder SPEC is required (open_clip:<model>[/<tag or checkpoint>] or "
                         "hf:<CLIP name or dir>)")
    cfg = cfg or load_preset(quick)
    data = data or ThreeVLCocoData()
    run_cfg = encoder_run or EncoderRun()
    out = Path(out)
    t_start = time.perf_counter()
    lazy = LazyEncoder(encoder, run_cfg)
    train_data, ann = _coco(data, "train")
    captions, iot = list(train_data.captions), np.asarray(train_data.image_of_text)
    if cfg.max_train_captions:
        captions, iot = captions[: cfg.max_train_captions], iot[: cfg.max_train_captions]
    paths = train_data.image_paths()
    bench = _benchmarks(data)
    coco_test = _coco(data, "test")[0]
    base = base_encoder(lazy)
    train_key = {"data": data_hash([ann], train_data.images, train_data.root), "n_captions": len(captions)}
    # "generator" is a cache-key literal (the module's name when the key was made): kept, so cached trees stay found
    trees_dir = runner.stage("trees", {**train_key, "seed": cfg.seed, "generator": "vlctl.methods.trees"},
                             lambda w, r: _trees(cfg, captions, w, r), resumable=True)
    ft_fields = ("rank", "lora_alpha", "lr", "weight_decay", "batch_size", "epochs", "warmup_steps", "alpha",
                 "level_reduction", "max_levels", "max_negatives", "seed",
                 *(("stop_after_steps",) if cfg.stop_after_steps else ()))  # 0: the keys of earlier runs
    ft_dirs = {}
    for mode in FT_MODES:
        key = {"encoder": lazy.canonical_spec, "trees": trees_dir.name, "mode": mode, "precision": run_cfg.precision,
               **{f: getattr(cfg, f) for f in ft_fields}}
        ft_dirs[mode] = runner.stage(
            f"finetune-{mode}", key,
            lambda w, r, mode=mode: _finetune(cfg, mode, lazy, run_cfg, paths, captions, iot, trees_dir, w, r),
            resumable=True, distributed=True)
        rec = read_json(ft_dirs[mode] / "fit.json")
        if rec["base_id"] != base.id:
            raise VlctlError(f"{ft_dirs[mode]}: cached stage was computed with encoder {rec['base_id']!r}, but the "
                             f"encoder now is {base.id!r} (same spec, other weights); refusing to mix them: rerun "
                             "with --force, or another --stages")
    if not runner.leave():  # torchrun ranks other than 0 stop here; rank 0 evaluates and reports
        return out / "report.md"
    bench_key = {g: data_hash([], [f"{root / it.image}|{it.box}|{it.positives[0]}|{it.negatives[0]}"
                                   for it, root in items], None)
                 for kind in ("checklist", "sugarcrepe", "aro") for g, items in bench[kind].items()}
    eval_key = {"finetune": {m: ft_dirs[m].name for m in FT_MODES}, "encoder": lazy.canonical_spec,
                "bench": bench_key, "coco_test": data_hash([ann], coco_test.images, coco_test.root),
                "removal_fraction": cfg.removal_fraction}
    eval_dir = runner.stage("evaluate", eval_key, lambda w: _evaluate(cfg, lazy, run_cfg, ft_dirs, bench, coco_test, w))
    ev = read_json(eval_dir / "eval.json")
    acc = ev["accuracy"]
    checklist = {c: {m: acc[f"{m}__checklist__{c}"] for m in MODELS} for c in bench["checklist"]}
    if checklist:
        checklist["average"] = {m: float(np.mean([checklist[c][m] for c in bench["checklist"]])) for m in MODELS}
    models5 = (*MODELS[:-1],)
    trees_info = read_json(trees_dir / "trees.json")
    token_removal = {}
    for m, tr in (("base", "base_anchor_tr"), ("tree", "tree_anchor_tr")):
        if bench["checklist"]:
            before = float(np.mean([acc[f"{m}__checklist__{c}"] for c in bench["checklist"]]))
            after = float(np.mean([acc[f"{tr}__checklist__{c}"] for c in bench["checklist"]]))
            token_removal[m] = {"anchor": {"fractions": [0.0, cfg.removal_fraction], "accuracy": [before, after],
                                           "at_65": after}}
    results = {
        "recipe": "3vl-coco", "quick": quick, "config": config_to_dict(cfg), "data": config_to_dict(data),
        "encoder_run": config_to_dict(run_cfg), "encoder_id": base.id, "encoder_spec": lazy.canonical_spec,
        "random_weights": is_random(base.id), "paper": PAPER,
        "checklist": checklist,
        "n_items": {c: len(v) for c, v in bench["checklist"].items()},
        "sugarcrepe": {g: {m: acc[f"{m}__sugarcrepe__{g}"] for m in models5} for g in bench["sugarcrepe"]},
        "aro": {g: {m: acc[f"{m}__aro__{g}"] for m in models5} for g in bench["aro"]},
        "coco_t2i_r1": ev["coco_t2i_r1"],
        "token_removal": token_removal,
        "failures_by_pos": ev["failures_by_pos"], "n_items_by_pos": ev["n_items_by_pos"],
        "fine_tuning": {m: read_json(ft_dirs[m] / "fit.json") for m in FT_MODES},
        "trees": {"seconds": trees_info["seconds"], "n_unique": trees_info["n_unique"],
                  "mean_levels": float(np.mean([len(t) for t in trees_info["trees"]])),
                  "negclip_coverage": float(np.mean([n is not None for n in trees_info["negatives"]]))},
        "eval_timings": ev["timings"],
        "anchor_fallbacks": len(ev.get("anchor_fallbacks", [])),
        "timings": {**runner.timings, "total_seconds": time.perf_counter() - t_start},
    }
    atomic_write_json(out / "results.json", results)
    import shutil

    (out / "arrays").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(eval_dir / "eval.npz", out / "arrays" / "scores.npz")
    _report(cfg, results).write(out)
    return out / "report.md"


def _report(cfg: ThreeVLCocoRecipe, r: dict) -> Report:
    rep = Report("3vl-coco: tree-loss LoRA on COCO, compositional benchmarks")
    report_header(rep, r["encoder_id"], r["encoder_spec"])
    rep.text(f"Rank-{cfg.rank} LoRA (peft) fine-tuned on COCO train captions for {cfg.epochs} epochs, batch "
             f"{cfg.batch_size}, lr {cfg.lr:g}, wd {cfg.weight_decay}, alpha {cfg.alpha}; the baselines use the same "
             "data, steps and rank. Accuracy = percent of items whose positive caption scores above its negative; "
             "recomputable from arrays/scores.npz (scores_<model>__<kind>__<set>: (n, 2) [positive, negative] "
             "cosines; accuracy = 100 mean(scores[:, 0] > scores[:, 1])). Paper: CLIP ViT-B/32.")
    if r["checklist"]:
        rep.heading("VL-CheckList")
        rows = [[c, *[r["checklist"][c][m] for m in MODELS]] for c in r["checklist"]]
        rows.append(["paper average", PAPER["checklist_avg"]["base"], None, PAPER["checklist_avg"]["negclip"],
                     PAPER["checklist_avg"]["tree"], PAPER["checklist_avg"]["tree_anchor_tr"]])
        rep.table(["category", *MODELS], rows)
        rep.text(f"tree_anchor_tr: the tree model scoring each image re-encoded without the {cfg.removal_fraction:.0%} "
                 f"least relevant patches of the Anchor map of 'AP or AN' ({r['anchor_fallbacks']} distinct pairs the "
                 "anchor parser refused used the whole 'P or N' instead; listed in the evaluate stage's eval.json).")
    for kind in ("sugarcrepe", "aro"):
        if r[kind]:
            rep.heading({"sugarcrepe": "SugarCrepe", "aro": "ARO"}[kind])
            rep.table(["set", *MODELS[:-1]], [[g, *[v[m] for m in MODELS[:-1]]] for g, v in r[kind].items()])
    if r["coco_t2i_r1"]:
        rep.heading("COCO text-to-image R@1 (Karpathy test)")
        rep.table(["model", "ours", "paper"], [[m, v, PAPER["coco_t2i_r1"].get(m)] for m, v in r["coco_t2i_r1"].items()])
    rep.heading("Failures per POS of the replaced word")
    rep.table(["model", *POS_TAGS], [[m, *[v[t] for t in POS_TAGS]] for m, v in r["failures_by_pos"].items()]
              + [["items", *[r["n_items_by_pos"][t] for t in POS_TAGS]]])
    rep.text(f"Paper: 3VL cuts VERB failures by {PAPER['pos_failure_reduction_vs_base']['VERB']}% and ADP by "
             f"{PAPER['pos_failure_reduction_vs_base']['ADP']}% against CLIP.")
    rep.timings(r["timings"])
    return rep
