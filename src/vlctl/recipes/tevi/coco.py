"""Recipe `tevi-coco`: TEVI on real image-text data (docs/methods.md §1; Tables 2-3 of the TEVI paper).

    vlctl reproduce tevi-coco --encoder open_clip:ViT-B-16/<tag> --coco-root coco/ \\
        --coco-annotations dataset_coco.json [--flickr-root ... --rococo-annotations ...] --out runs/tevi-coco

Stages: embed-train (COCO Karpathy train, or a CSV / WebDataset caption set: image and caption
embeddings of the frozen encoder) -> sae (TopK SAE, K=128, AuxK 256, expansion 32, 50 epochs)
-> tevi (the caption-conditioned mask, negative conditioning, Eq. 11) -> embed-<benchmark> (COCO
test, Flickr30k test, DOCCI, IIW, RoCOCO) -> sae-sweep (K x expansion) -> evaluate -> report.
Under torchrun (`vlctl.recipes.runner`) the embedding stages shard the images over the ranks and
the SAE, mask and sweep fits train DDP; rank 0 evaluates and reports. The sae and tevi stages
resume after a kill from their last checkpoint (in the stage's run/).

Reported: positive-pair alignment before / after editing (COCO test), R@1/5/10 both ways for
base vs exhaustive TEVI vs TEVI-rerank of the base top k on every benchmark given, RoCOCO R@1,
drop rate ((R@1 - Rp@1) / R@1) and RSMS (percent of images whose top-1 caption is a perturbed
one; Park et al. 2024), and the SAE selection sweep, beside the paper's numbers. results.json
shares its keys with tevi-mad (alignment, retrieval.{base,tevi,tevi_rerank}, sae, sae_sweep,
timings) so reports and figures read both.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from vlctl.config import config_from_dict, config_to_dict, opt
from vlctl.fsops import VlctlError
from vlctl.io import atomic_save_npz, atomic_write_json, atomic_write_text, read_json
from vlctl.recipes.real_common import (
    EncoderRun,
    LazyEncoder,
    data_hash,
    embed_stage,
    estimate_line,
    is_main_rank,
    is_random,
    load_embeddings,
    rank_device,
    report_header,
)
from vlctl.recipes.real_data import TeviCocoData, flag, need_dir, need_file
from vlctl.recipes.runner import Runner
from vlctl.report.writer import Report

# TEVI paper (CLIP ViT-B/16 trained on CC12M), R@1 base -> TEVI; alignment on COCO.
PAPER = {
    "alignment": {"before": 0.417, "after": 0.470},
    "coco": {"i2t@1": (32.98, 35.66)},
    "flickr": {"i2t@1": (59.66, 64.20)},
    "docci": {"i2t@1": (20.38, 24.20), "t2i@1": (7.16, 8.55)},
}
BENCHMARKS = ("coco", "flickr", "docci", "iiw")


@dataclasses.dataclass(frozen=True)
class TeviCocoRecipe:
    sae_k: int = opt(128, "SAE active latents K (paper: 128 of {64, 128, 256})", ge=1, le=2**24)
    sae_aux_k: int = opt(256, "SAE AuxK dead latents (paper: 256)", ge=0, le=2**24)
    sae_expansion: int = opt(32, "SAE d1 = expansion * d (paper: 32 for ViT-B/16)", ge=1, le=1024)
    sae_epochs: int = opt(50, "SAE epochs (paper: 50)", ge=1, le=100_000)
    sae_lr: float = opt(1e-3, "SAE learning rate (paper: swept in {1e-4, 5e-4, 1e-3, 5e-3})", gt=0, le=10)
    sae_batch_size: int = opt(4096, "SAE batch size", ge=1, le=2**20)
    conditioning: str = opt("negative", "mask conditioning: negative (Eq. 11, real data) | positive (Eq. 10)",
                            choices=("positive", "negative"))
    mask_hidden: int = opt(512, "mask MLP hidden width", ge=1, le=16384)
    mask_epochs: int = opt(10, "mask training epochs", ge=1, le=100_000)
    mask_lr: float = opt(1e-3, "mask learning rate", gt=0, le=10)
    mask_batch_size: int = opt(256, "mask batch size (the InfoNCE negatives)", ge=1, le=16384)
    text_finetune: bool = opt(False, "also fine-tune the encoder's text tower beside the mask (OpenCLIP encoders)")
    text_lr: float = opt(1e-6, "learning rate of the fine-tuned text tower (paper: 1e-6)", gt=0, le=10)
    rerank_k: int = opt(100, "TEVI-rerank: re-score the base model's top k", ge=1, le=10**6)
    exhaustive_max_pairs: int = opt(25_000_000, "exhaustive TEVI scoring only when images x captions is at most "
                                    "this (COCO test: 5k x 25k); above it only TEVI-rerank is reported",
                                    ge=0, le=10**12)
    max_train_pairs: int = opt(0, "use the first N training pairs only (0 = all)", ge=0, le=10**10)
    sweep_k: tuple[int, ...] = opt((64, 128, 256), "SAE sweep: values of K", ge=1, le=2**24)
    sweep_expansion: tuple[int, ...] = opt((16, 32), "SAE sweep: expansion factors", ge=1, le=1024)
    sweep_epochs: int = opt(10, "SAE sweep: epochs per fit", ge=1, le=100_000)
    seed: int = opt(0, "seed of the SAE and mask fits", ge=0, le=2**32 - 1)


def load_preset(quick: bool) -> TeviCocoRecipe:
    path = Path(__file__).with_name("tevi-coco.json")
    return config_from_dict(TeviCocoRecipe, read_json(path)["quick" if quick else "full"], source=str(path))


# --- data ----------------------------------------------------------------------------------------


def _train_pairs(data: TeviCocoData, work_images: Path | None = None):
    """(image paths, captions, image_of_text, files hashed) of the training pairs."""
    from vlctl.data.loaders.folder import load_caption_table
    from vlctl.data.loaders.retrieval import load_karpathy
    from vlctl.data.loaders.webdataset import unpack_webdataset

    if data.train_shards:
        if work_images is None:
            raise VlctlError("train shards need a directory to unpack into")
        paths, caps, manifests = unpack_webdataset(data.train_shards, work_images, progress=is_main_rank())
        if not paths:
            raise VlctlError(f"{data.train_shards}: no sample with an image and a caption; expected "
                             "<key>.jpg + <key>.txt per sample (img2dataset's WebDataset output)")
        return paths, caps, np.arange(len(caps)), manifests
    if data.train_table:
        table = need_file(data.train_table, flag("train_table"), "table")
        root = need_dir(data.train_table_root, flag("train_table_root"), "table")
        d = load_caption_table(table, root=root)
        return d.image_paths(), d.captions, d.image_of_text, [table]
    root = need_dir(data.coco_root, flag("coco_root"), "coco")
    ann = need_file(data.coco_annotations, flag("coco_annotations"), "coco")
    d = load_karpathy(ann, split="train", root=root)
    return d.image_paths(), d.captions, d.image_of_text, [ann]


def _benchmarks(data: TeviCocoData) -> dict:
    """{name: ImageTextData} of every retrieval benchmark given (COCO test whenever COCO is)."""
    from vlctl.data.loaders.retrieval import load_karpathy, load_long_captions

    out = {}
    if data.coco_annotations:
        out["coco"] = load_karpathy(need_file(data.coco_annotations, flag("coco_annotations"), "coco"), split="test",
                                    root=need_dir(data.coco_root, flag("coco_root"), "coco"))
    if data.flickr_annotations or data.flickr_root:
        out["flickr"] = load_karpathy(need_file(data.flickr_annotations, flag("flickr_annotations"), "flickr"),
                                      split="test", root=need_dir(data.flickr_root, flag("flickr_root"), "flickr"))
    for name, field in (("docci", "DOCCI"), ("iiw", "IIW")):
        ann, root = getattr(data, f"{name}_annotations"), getattr(data, f"{name}_root")
        if ann or root:
            out[name] = load_long_captions(need_file(ann, flag(f"{name}_annotations"), "long"), field=field,
                                           root=need_dir(root, flag(f"{name}_root"), "long"))
    if not out:
        raise VlctlError(f"tevi-coco: no retrieval benchmark given; pass {flag('coco_annotations')} (COCO test) or "
                         f"{flag('flickr_annotations')} / {flag('docci_annotations')} / {flag('iiw_annotations')}")
    return out


# --- stages --------------------------------------------------------------------------------------


def _fit_sae(cfg: TeviCocoRecipe, x: np.ndarray, encoder_id: str, device: str, k: int, expansion: int, epochs: int,
             run_dir: Path | None = None, resume: bool = False):
    from vlctl.methods.sae.model import SparseAutoencoder

    sae = SparseAutoencoder(k=min(k, expansion * x.shape[1]), expansion=expansion, aux_k=cfg.sae_aux_k,
                            epochs=epochs, lr=cfg.sae_lr, batch_size=cfg.sae_batch_size, seed=cfg.seed, device=device,
                            out_dir=run_dir)
    steps = epochs * max(1, len(x) // min(cfg.sae_batch_size, len(x)))
    t0 = time.perf_counter()
    sae.fit(x, encoder_id, checkpoint_every=max(1, steps // 10) if run_dir else 0, resume=resume)
    return sae, time.perf_counter() - t0


def _sae_stage(cfg, train, encoder_id, device, work: Path, resume: bool = False) -> None:
    import shutil

    from vlctl.train.distributed import barrier

    x = train["image_emb"]
    n, d = x.shape
    per_epoch = max(1, n // min(cfg.sae_batch_size, n))
    # A stage killed before its first checkpoint starts over: nothing to resume from.
    resume = resume and (work / "run" / "checkpoint" / "state.json").is_file()
    if not resume:
        t0 = time.perf_counter()
        _fit_sae(cfg, x, encoder_id, device, cfg.sae_k, cfg.sae_expansion, 1)  # one epoch, timed: the rate
        rate = per_epoch / max(time.perf_counter() - t0, 1e-9)
        # weights, gradients and two AdamW moments of W_E and W_D, plus the embeddings
        estimate_line("stage sae", cfg.sae_epochs * per_epoch, rate, 16 * 2 * cfg.sae_expansion * d * d + x.nbytes,
                      unit="steps")
        if is_main_rank() and (work / "run").exists():
            shutil.rmtree(work / "run")  # the stage's own half-run, from before the kill
        barrier()
    sae, seconds = _fit_sae(cfg, x, encoder_id, device, cfg.sae_k, cfg.sae_expansion, cfg.sae_epochs,
                            run_dir=work / "run", resume=resume)
    if not is_main_rank():  # under torchrun every rank fits (DDP); rank 0 writes
        return
    sae.save(work / "sae")
    atomic_write_json(work / "fit.json", {"seconds": seconds, "samples_per_s": n * cfg.sae_epochs / max(seconds, 1e-9)})


class _TextTower:
    """Factory of the trainable text tower of an OpenCLIP model (TEVI's optional f_t fine-tuning)."""

    @staticmethod
    def build(encoder):
        import copy

        from torch import nn

        from vlctl.encoders.open_clip_encoder import OpenCLIPEncoder

        if not isinstance(encoder, OpenCLIPEncoder):
            raise VlctlError(f"tevi-coco text_finetune: fine-tunes OpenCLIP text towers; the encoder is a "
                             f"{type(encoder).__name__}; set text_finetune false")

        class TextTower(nn.Module):
            """tokens (n, C) -> unit-norm text embeddings (n, d): the CLIP model without its image tower."""

            def __init__(self, clip: nn.Module):
                super().__init__()
                self.clip = copy.deepcopy(clip).cpu()
                self.clip.visual = nn.Identity()  # only the text weights are trained and saved

            def forward(self, tokens):
                return self.clip.encode_text(tokens, normalize=True)

        return TextTower(encoder.model)


def _tower_texts(tower, encoder, texts: list[str], device: str, batch: int = 256) -> np.ndarray:
    """Text embeddings of `texts` by a (fine-tuned) text tower."""
    import torch

    tower = tower.to(device).eval()
    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            out.append(tower(encoder.tokenize(texts[i:i + batch]).to(device)).float().cpu().numpy())
    tower.cpu()
    return np.concatenate(out) if out else np.zeros((0, int(encoder.embed_dim)), np.float32)


def _tevi_stage(cfg, train, sae_dir: Path, device: str, work: Path, lazy=None, captions=None,
                resume: bool = False) -> None:
    import shutil

    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.tevi.estimator import TEVI
    from vlctl.train.distributed import barrier

    sae = SparseAutoencoder.load(sae_dir / "sae")
    iot = train["image_of_text"]
    x, t = train["image_emb"][iot], train["text_emb"]
    batch = min(cfg.mask_batch_size, len(t))
    steps = cfg.mask_epochs * max(1, len(t) // batch)

    def make(epochs: int, out_dir):
        return TEVI(hidden=cfg.mask_hidden, conditioning=cfg.conditioning, lr=cfg.mask_lr, epochs=epochs,
                    batch_size=cfg.mask_batch_size, seed=cfg.seed, device=device, out_dir=out_dir, progress=False,
                    text_lr=cfg.text_lr)

    def fit(est, rows, **kw):
        if not cfg.text_finetune:
            return est.fit(x[rows], t[rows], sae=sae, **kw)
        enc = lazy.get()
        return est.fit(x[rows], sae=sae, text_encoder=_TextTower.build(enc), texts=tokens[rows], **kw)

    tokens = lazy.get().tokenize(captions) if cfg.text_finetune else None
    # A stage killed before its first checkpoint starts over: nothing to resume from.
    resume = resume and (work / "run" / "checkpoint" / "state.json").is_file()
    if not resume:
        probe = min(len(t), 4 * batch)  # four steps, timed: the rate
        t0 = time.perf_counter()
        fit(make(1, None), slice(0, probe))
        rate = max(1, probe // batch) / max(time.perf_counter() - t0, 1e-9)
        d, d1 = x.shape[1], sae.config_.n_latents
        estimate_line("stage tevi", steps, rate, 16 * cfg.mask_hidden * (d + cfg.mask_hidden + d1)
                      + 4 * batch * batch * (d + d1) + x.nbytes + t.nbytes, unit="steps")
        if is_main_rank() and (work / "run").exists():
            shutil.rmtree(work / "run")  # the stage's own half-run, from before the kill
        barrier()
    tevi = make(cfg.mask_epochs, work / "run")
    t0 = time.perf_counter()
    every = max(1, steps // 10)  # about ten checkpoints a fit (a checkpoint keeps the open log window)
    fit(tevi, slice(None), checkpoint_every=every, resume=resume)
    seconds = time.perf_counter() - t0
    if not is_main_rank():
        return
    tevi.save(work / "tevi")
    atomic_write_json(work / "fit.json", {"seconds": seconds, "steps": steps, "steps_per_s": steps / max(seconds, 1e-9),
                                          "resumed": resume})


def _sweep_stage(cfg, train, test_img: np.ndarray, encoder_id: str, device: str, work: Path,
                 sae_rate: float | None = None) -> None:
    from vlctl.methods.sae.rows import fraction_variance_unexplained

    n, d = train["image_emb"].shape
    if sae_rate:  # the main SAE's measured samples/s, scaled by each fit's width
        fits = [(k, e) for k in cfg.sweep_k for e in cfg.sweep_expansion]
        work_units = sum(cfg.sweep_epochs * n * e / cfg.sae_expansion for _, e in fits)
        estimate_line("stage sae-sweep", int(work_units), sae_rate, 16 * 2 * max(cfg.sweep_expansion) * d * d,
                      unit="samples")
    rows = []
    for k in cfg.sweep_k:
        for e in cfg.sweep_expansion:
            sae, seconds = _fit_sae(cfg, train["image_emb"], encoder_id, device, k, e, cfg.sweep_epochs)
            rec = sae.reconstruct(test_img).numpy()
            rows.append({"k": k, "expansion": e, "n_latents": sae.config_.n_latents,
                         "fvu": float(fraction_variance_unexplained(test_img, rec)), "dead_latents": sae.n_dead_,
                         "seconds": seconds})
    if is_main_rank():
        atomic_write_json(work / "sweep.json", rows)


# --- evaluation ----------------------------------------------------------------------------------


def _relevance(image_of_text: np.ndarray, n_images: int) -> np.ndarray:
    rel = np.zeros((n_images, len(image_of_text)), dtype=bool)
    rel[image_of_text, np.arange(len(image_of_text))] = True
    return rel


def _recall_rerank(tevi, base: np.ndarray, img: np.ndarray, txt: np.ndarray, relevant: np.ndarray, k: int) -> dict:
    from vlctl.eval.metrics import recall_from_order

    k = min(k, base.shape[0], base.shape[1])
    t2i = tevi.rerank(base, img, txt, k=k, direction="t2i").order.numpy()
    i2t = tevi.rerank(base, img, txt, k=k, direction="i2t").order.numpy()
    return ({**{f"i2t{a}": v for a, v in recall_from_order(i2t, relevant.T).items()},
             **{f"t2i{a}": v for a, v in recall_from_order(t2i, relevant).items()}}, t2i, i2t)


def _evaluate_benchmark(cfg, tevi, emb: dict, name: str, arrays: Path, tuned_txt: np.ndarray | None = None) -> dict:
    """Base recall from the encoder's own caption embeddings; TEVI's from `tuned_txt` when the text
    tower was fine-tuned (else the same)."""
    from vlctl.eval.metrics import recall_at_k_relevant

    img, iot = emb["image_emb"], emb["image_of_text"]
    base = img @ emb["text_emb"].T
    txt = emb["text_emb"] if tuned_txt is None else tuned_txt
    relevant = _relevance(iot, len(img))
    out = {"n_images": len(img), "n_texts": len(txt), "base": recall_at_k_relevant(base, relevant)}
    exact = None
    if len(img) * len(txt) <= cfg.exhaustive_max_pairs:
        t0 = time.perf_counter()
        exact = tevi.scores(img, txt).numpy()
        out["seconds_exhaustive"] = time.perf_counter() - t0
        out["tevi"] = recall_at_k_relevant(exact, relevant)
    else:
        out["tevi"] = None
    t0 = time.perf_counter()
    out["tevi_rerank"], t2i, i2t = _recall_rerank(tevi, base, img, txt, relevant, cfg.rerank_k)
    out["seconds_rerank"] = time.perf_counter() - t0
    atomic_save_npz(arrays / f"retrieval_{name}.npz", base_scores=base, image_of_text=iot, rerank_order_t2i=t2i,
                    rerank_order_i2t=i2t, **({"tevi_scores": exact} if exact is not None else {}))
    return out


def _rococo(cfg, tevi, emb: dict, arrays: Path, tuned_pool: np.ndarray | None = None) -> dict:
    """RoCOCO from score matrices: clean R@1 (originals), perturbed R@1 (originals + altered in the
    pool), drop rate 100 (R@1 - Rp@1) / R@1, RSMS = percent of images whose top-1 caption is altered."""
    from vlctl.eval.metrics import recall_at_k_relevant

    img, orig, alt = emb["image_emb"], emb["text_emb"], emb["altered_emb"]
    own_o = emb["image_of_text"]
    pool = np.concatenate([orig, alt])
    relevant = np.zeros((len(img), len(pool)), dtype=bool)
    relevant[own_o, np.arange(len(orig))] = True
    out = {}
    for model in ("base", "tevi"):
        scores = img @ pool.T if model == "base" else tevi.scores(img, pool if tuned_pool is None else tuned_pool).numpy()
        clean = recall_at_k_relevant(scores[:, : len(orig)], relevant[:, : len(orig)])["i2t@1"]
        pert = recall_at_k_relevant(scores, relevant)["i2t@1"]
        out[model] = {"r1": clean, "r1_perturbed": pert, "drop_rate": 100.0 * (clean - pert) / clean if clean else None,
                      "rsms": 100.0 * float(np.mean(np.argmax(scores, axis=1) >= len(orig)))}
        atomic_save_npz(arrays / f"rococo_{model}.npz", scores=scores, image_of_original=own_o, n_original=len(orig))
    return out


def run(out: Path, quick: bool = False, force: bool = False, stages: str | Path | None = None,
        from_scratch: bool = False, *, encoder: str | None = None, data: TeviCocoData | None = None,
        cfg: TeviCocoRecipe | None = None, encoder_run: EncoderRun | None = None) -> Path:
    # No shipped checkpoints exist for the real recipes; from_scratch is passed on for the runner's contract.
    runner = Runner(out, force=force, stages=stages, from_scratch=from_scratch,
                    device=(encoder_run or EncoderRun()).device, torchrun=True)
    if not encoder:
        raise VlctlError("tevi-coco: --encoder SPEC is required (open_clip:..., hf:..., tiny:DIR)")
    cfg = cfg or load_preset(quick)
    data = data or TeviCocoData()
    run_cfg = encoder_run or EncoderRun()
    t_start = time.perf_counter()
    lazy = LazyEncoder(encoder, run_cfg)
    out = Path(out)

    with runner.measure("data"):  # reading the annotations (and unpacking WebDataset shards)
        paths, caps, iot, files = _train_pairs(data, runner.stages / "shards-unpacked" if data.train_shards else None)
    if cfg.max_train_pairs:
        keep = np.arange(len(caps))[: cfg.max_train_pairs]
        caps, iot = [caps[i] for i in keep], iot[keep]
        used = sorted(set(iot.tolist()))
        remap = {old: new for new, old in enumerate(used)}
        paths, iot = [paths[i] for i in used], np.array([remap[i] for i in iot.tolist()], dtype=np.int64)
    train_key = {"data": data_hash(files, [str(p) for p in paths], None), "n_pairs": len(caps)}
    train_dir = embed_stage(runner, "embed-train", lazy, train_key, paths, caps, run_cfg,
                            extra={"image_of_text": np.asarray(iot, dtype=np.int64)})
    train = load_embeddings(train_dir)
    encoder_id = read_json(train_dir / "encoder.json")["encoder_id"]

    bench = _benchmarks(data)
    bench_emb = {}
    for name, d in bench.items():
        key = {"data": data_hash([], d.images, d.root), "captions": data_hash([], d.captions, None)}
        bench_emb[name] = load_embeddings(embed_stage(runner, f"embed-{name}", lazy, key, d.image_paths(), d.captions,
                                                      run_cfg, extra={"image_of_text": d.image_of_text}))
    rococo_emb, rococo_texts = None, []
    if data.rococo_annotations:
        from vlctl.data.loaders.retrieval import load_rococo

        ann = need_file(data.rococo_annotations, flag("rococo_annotations"), "rococo")
        orig, alt = load_rococo(ann, root=need_dir(data.coco_root, flag("coco_root"), "coco"))
        rococo_texts = orig.captions + alt.captions
        key = {"data": data_hash([ann], orig.images, orig.root)}
        st = embed_stage(runner, "embed-rococo", lazy, key, orig.image_paths(), orig.captions + alt.captions, run_cfg,
                         extra={"image_of_text": orig.image_of_text, "n_original": np.array(len(orig.captions))})
        e = load_embeddings(st)
        n_o = int(e["n_original"])
        rococo_emb = {"image_emb": e["image_emb"], "text_emb": e["text_emb"][:n_o], "altered_emb": e["text_emb"][n_o:],
                      "image_of_text": e["image_of_text"]}

    device = rank_device(run_cfg.device)
    sae_key = {"train": train_dir.name, **{f: getattr(cfg, f) for f in ("sae_k", "sae_aux_k", "sae_expansion",
                                                                        "sae_epochs", "sae_lr", "sae_batch_size", "seed")}}
    sae_dir = runner.stage("sae", sae_key, lambda w, resume: _sae_stage(cfg, train, encoder_id, device, w, resume),
                           resumable=True, distributed=True)
    mask_key = {"sae": sae_dir.name, **{f: getattr(cfg, f) for f in ("conditioning", "mask_hidden", "mask_epochs",
                                                                     "mask_lr", "mask_batch_size", "text_finetune",
                                                                     "text_lr")}}
    tevi_dir = runner.stage("tevi", mask_key,
                            lambda w, resume: _tevi_stage(cfg, train, sae_dir, device, w, lazy, caps, resume),
                            resumable=True, distributed=True)
    headline = next(iter(bench))
    test_img = bench_emb[headline]["image_emb"]
    sweep_key = {"train": train_dir.name, "test": headline, "k": list(cfg.sweep_k),
                 "expansion": list(cfg.sweep_expansion), "epochs": cfg.sweep_epochs, "aux_k": cfg.sae_aux_k,
                 "lr": cfg.sae_lr, "seed": cfg.seed}
    sae_rate = read_json(sae_dir / "fit.json")["samples_per_s"]
    sweep_dir = runner.stage("sae-sweep", sweep_key,
                             lambda w: _sweep_stage(cfg, train, test_img, encoder_id, device, w, sae_rate),
                             distributed=True)
    if not runner.leave():  # torchrun ranks other than 0 stop here; rank 0 evaluates and reports
        return out / "report.md"

    from vlctl.eval import metrics
    from vlctl.methods.sae.model import SparseAutoencoder
    from vlctl.methods.sae.rows import fraction_variance_unexplained
    from vlctl.methods.tevi.estimator import TEVI

    with runner.measure("evaluate"):
        tower = _TextTower.build(lazy.get()) if cfg.text_finetune else None
        tevi = TEVI.load(tevi_dir / "tevi", text_encoder=tower)
        sae = SparseAutoencoder.load(sae_dir / "sae")
        arrays = out / "arrays"
        tuned = {}
        if tower is not None:  # TEVI scores captions embedded by its fine-tuned text tower; the base keeps its own
            for name, d in bench.items():
                tuned[name] = _tower_texts(tevi.text_encoder_, lazy.get(), d.captions, device)
        retrieval = {name: _evaluate_benchmark(cfg, tevi, e, name, arrays, tuned.get(name)) for name, e in bench_emb.items()}
        h = bench_emb[headline]
        img_p, txt = h["image_emb"][h["image_of_text"]], tuned.get(headline, h["text_emb"])
        edited = tevi.edit(img_p, txt).numpy()
        cos_before = metrics.positive_pair_cosine(img_p, h["text_emb"])
        cos_after = metrics.positive_pair_cosine(edited, txt)
        atomic_save_npz(arrays / "alignment.npz", image_emb=img_p, edited_emb=edited, text_emb=txt,
                        base_text_emb=h["text_emb"])
        rec = sae.reconstruct(test_img).numpy()
        rococo = None
        if rococo_emb is not None:
            pool = None if tower is None else _tower_texts(tevi.text_encoder_, lazy.get(), rococo_texts, device)
            rococo = _rococo(cfg, tevi, rococo_emb, arrays, pool)
        atomic_write_text(arrays / "README.md", ARRAYS_README)
    results = {
        "recipe": "tevi-coco", "quick": quick, "config": config_to_dict(cfg), "data": config_to_dict(data),
        "encoder_run": config_to_dict(run_cfg), "encoder_id": encoder_id, "encoder_spec": lazy.canonical_spec,
        "random_weights": is_random(encoder_id), "n_train_pairs": len(caps), "n_test": len(test_img),
        "headline": headline,
        "alignment": {"before": float(cos_before.mean()), "after": float(cos_after.mean())},
        "retrieval": {m: retrieval[headline][m] for m in ("base", "tevi", "tevi_rerank")},
        "retrieval_by_dataset": retrieval,
        "rococo": rococo,
        "sae": {"fvu": float(fraction_variance_unexplained(test_img, rec)), "dead_latents": sae.n_dead_,
                "n_latents": sae.config_.n_latents, "k": sae.config_.k,
                "fit": read_json(sae_dir / "fit.json")},
        "tevi_fit": read_json(tevi_dir / "fit.json"),
        "sae_sweep": read_json(sweep_dir / "sweep.json"),
        "paper": PAPER,
        "timings": {**runner.timings, "total_seconds": time.perf_counter() - t_start},
    }
    _figures(out, cos_before, cos_after)
    atomic_write_json(out / "results.json", results)
    _report(cfg, results).write(out)
    return out / "report.md"


ARRAYS_README = """# arrays/

- `retrieval_<benchmark>.npz`: `base_scores` (n_images, n_texts) cosine, `tevi_scores` (when
  exhaustive scoring ran) cos(e_{p|q}, t_q), `image_of_text`; relevant[i, j] = image_of_text[j] == i;
  recall = `vlctl.eval.metrics.recall_at_k_relevant(scores, relevant)`. TEVI-rerank:
  `rerank_order_t2i` / `rerank_order_i2t`, recall = `metrics.recall_from_order(order, relevant)`
  (t2i) and `recall_from_order(order_i2t, relevant.T)` (i2t).
- `alignment.npz`: `image_emb` (image of each caption), `edited_emb` (edited by its caption),
  `text_emb`; alignment = mean of `metrics.positive_pair_cosine`.
- `rococo_<model>.npz`: `scores` (n_images, n_original + n_altered), originals first; R@1 =
  i2t@1 of the first n_original columns, perturbed R@1 over all columns, RSMS = percent of rows
  whose argmax is an altered column.
"""


def _figures(out: Path, before: np.ndarray, after: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "figures").mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bins = np.linspace(min(before.min(), after.min()), max(before.max(), after.max()) + 1e-6, 50)
    ax.hist(before, bins=bins, alpha=0.6, label=f"base (mean {before.mean():.3f})")
    ax.hist(after, bins=bins, alpha=0.6, label=f"TEVI-edited (mean {after.mean():.3f})")
    ax.set_xlabel("cosine(image, its caption)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "figures" / "positive_cosine.png", dpi=120)
    plt.close(fig)


def _report(cfg: TeviCocoRecipe, r: dict) -> Report:
    rep = Report("tevi-coco: TEVI on real image-text data")
    report_header(rep, r["encoder_id"], r["encoder_spec"])
    rep.text(f"{r['n_train_pairs']} training pairs; SAE K={cfg.sae_k}, AuxK={cfg.sae_aux_k}, expansion "
             f"{cfg.sae_expansion}, {cfg.sae_epochs} epochs; mask: {cfg.conditioning} conditioning, {cfg.mask_epochs} "
             "epochs. Paper: CLIP ViT-B/16 trained on CC12M. Every number is recomputable from arrays/ "
             "(arrays/README.md).")
    rep.heading("Alignment")
    rep.table(["", "ours", "paper"], [["base", r["alignment"]["before"], PAPER["alignment"]["before"]],
                                      ["TEVI-edited", r["alignment"]["after"], PAPER["alignment"]["after"]]], digits=3)
    rep.figure("figures/positive_cosine.png", "Positive-pair cosine before and after TEVI editing")
    for name, res in r["retrieval_by_dataset"].items():
        rep.heading(f"Retrieval: {name} ({res['n_images']} images, {res['n_texts']} captions)")
        paper = PAPER.get(name, {})
        rows = []
        for k in res["base"]:
            p = paper.get(k)
            rows.append([k, res["base"][k], None if res["tevi"] is None else res["tevi"][k], res["tevi_rerank"][k],
                         p[0] if p else None, p[1] if p else None])
        rep.table(["recall", "base", "TEVI", "TEVI-rerank", "paper base", "paper TEVI"], rows)
    if r["rococo"] is not None:
        rep.heading("RoCOCO (same-concept perturbations)")
        rep.text("R@1 image->text on the originals; perturbed R@1 with the altered captions added to the pool; drop "
                 "rate = (R@1 - perturbed R@1) / R@1; RSMS = percent of images whose top caption is a perturbed one. "
                 "Paper: TEVI raises R@1 and lowers drop rate and RSMS.")
        rep.table(["model", "R@1", "perturbed R@1", "drop rate", "RSMS"],
                  [[m, v["r1"], v["r1_perturbed"], v["drop_rate"], v["rsms"]] for m, v in r["rococo"].items()])
    s = r["sae"]
    rep.heading("SAE")
    rep.text(f"{s['n_latents']} latents, K={s['k']}: test FVU {s['fvu']:.4f}, dead latents {s['dead_latents']}.")
    rep.table(["K", "expansion", "latents", "FVU", "dead", "seconds"],
              [[w["k"], w["expansion"], w["n_latents"], w["fvu"], w["dead_latents"], w["seconds"]]
               for w in r["sae_sweep"]], digits=3)
    rep.timings(r["timings"])
    return rep
