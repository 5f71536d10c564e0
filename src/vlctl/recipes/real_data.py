"""Where the real recipes find their datasets: one frozen dataclass per recipe, one field per
dataset root or annotation file (the `vlctl reproduce` flags are generated from these fields),
and the upstream layout each one expects, which the error for a missing root prints.

Kept free of heavy imports: `vlctl reproduce --help` reads these classes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vlctl.config import opt
from vlctl.fsops import VlctlError

# The upstream layouts, as the errors and `vlctl reproduce --help` print them.
LAYOUTS = {
    "coco": "COCO_ROOT/train2014/*.jpg and COCO_ROOT/val2014/*.jpg (https://cocodataset.org/#download), with "
            "Karpathy's dataset_coco.json (https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip)",
    "flickr": "FLICKR_ROOT/<image>.jpg (flickr30k-images/) with Karpathy's dataset_flickr30k.json",
    "long": "ROOT/<image> with a JSONL of {\"image\", \"IIW\", \"DOCCI\"} (google/imageinwords; "
            "https://google.github.io/docci/: docci_descriptions.jsonlines {\"image_file\", \"description\"})",
    "rococo": "RoCOCO's same_concept.json ([{\"image\": \"val2014/...\", \"caption\": [5 original + 5 altered]}], "
              "https://github.com/pseulki/rococo), images under COCO_ROOT",
    "table": "a CSV / TSV / JSONL with an image path column (filepath, image, ...) and a caption column "
             "(title, caption, ...), paths relative to TRAIN_TABLE_ROOT (CC12M via img2dataset)",
    "shards": "WebDataset tar shards, e.g. cc12m/{00000..01242}.tar (img2dataset output: <key>.jpg + <key>.txt)",
    "clevr4": "CLEVR4_ROOT/clevr_4_annots.json ({name: {color, shape, texture, count, split}}) and "
              "CLEVR4_ROOT/images/<name>.png (Clevr-4, https://github.com/sgvaze/clevr-4)",
    "stanford40": "STANFORD40_ROOT/JPEGImages/<action>_<nnn>.jpg and STANFORD40_ROOT/ImageSplits/{train,test}.txt "
                  "(http://vision.stanford.edu/Datasets/40actions.html), optional location / mood label CSV",
    "shotbench": "ShotBench's test.tsv (columns index, category, question, options, answer, type, path) with the "
                 "images under SHOTBENCH_ROOT (https://huggingface.co/datasets/Vchitect/ShotBench)",
    "vl_checklist": "a VL-CheckList data JSON ([[image_path, {\"POS\": [...], \"NEG\": [...]}], ...], "
                    "https://github.com/om-ai-lab/VL-CheckList), images under VL_CHECKLIST_ROOT (vg/, hake/, swig/)",
    "sugarcrepe": "SugarCrepe JSONs ({id: {\"filename\", \"caption\", \"negative_caption\"}}, "
                  "https://github.com/RAIVNLab/sugar-crepe), images: COCO val2017 under SUGARCREPE_ROOT",
    "aro": "ARO's visual_genome_relation.json / visual_genome_attribution.json "
           "(https://github.com/mertyg/vision-language-models-are-bows), Visual Genome images under ARO_ROOT",
}


def _path(help_: str):
    return opt(None, help_)


@dataclasses.dataclass(frozen=True)
class TeviCocoData:
    """TEVI on real data: training pairs and the retrieval benchmarks."""

    coco_root: str | None = _path("COCO image root (train2014/, val2014/)")
    coco_annotations: str | None = _path("Karpathy dataset_coco.json (train split trains, test split evaluates)")
    train_table: str | None = _path("training pairs from a CSV / TSV / JSONL caption table instead of COCO train")
    train_table_root: str | None = _path("image root of --train-table")
    train_shards: str | None = _path("training pairs from WebDataset shards, e.g. 'cc12m/{00000..01242}.tar'")
    flickr_root: str | None = _path("Flickr30k image root")
    flickr_annotations: str | None = _path("Karpathy dataset_flickr30k.json")
    docci_root: str | None = _path("DOCCI image root")
    docci_annotations: str | None = _path("DOCCI / IIW-DOCCI descriptions JSONL (field DOCCI)")
    iiw_root: str | None = _path("ImageInWords image root")
    iiw_annotations: str | None = _path("ImageInWords descriptions JSONL (field IIW)")
    rococo_annotations: str | None = _path("RoCOCO same_concept.json (images under --coco-root)")


@dataclasses.dataclass(frozen=True)
class Clevr4Data:
    """ControlEmbed on Clevr-4."""

    clevr4_root: str | None = _path("Clevr-4 folder (clevr_4_annots.json + images/)")


@dataclasses.dataclass(frozen=True)
class Stanford40Data:
    """ControlEmbed on Stanford 40 Actions."""

    stanford40_root: str | None = _path("Stanford 40 Actions folder (JPEGImages/, ImageSplits/)")
    stanford40_labels: str | None = _path("location / mood label file (CSV / TSV / JSONL / JSON) for Stanford 40")


@dataclasses.dataclass(frozen=True)
class ShotBenchData:
    """ControlEmbed on ShotBench."""

    shotbench_tsv: str | None = _path("ShotBench test.tsv")
    shotbench_root: str | None = _path("ShotBench image root (default: the TSV's folder)")


@dataclasses.dataclass(frozen=True)
class ThreeVLCocoData:
    """3VL: COCO train captions to fine-tune on, the compositional benchmarks to evaluate."""

    coco_root: str | None = _path("COCO image root (train2014/, val2014/)")
    coco_annotations: str | None = _path("Karpathy dataset_coco.json (train split fine-tunes, test split: T->I R@1)")
    vl_checklist_root: str | None = _path("VL-CheckList image root (vg/, swig/, hake/ ...)")
    vl_checklist_attribute: tuple[str, ...] = opt((), "VL-CheckList Attribute data JSONs", nonempty=False)
    vl_checklist_relation: tuple[str, ...] = opt((), "VL-CheckList Relation data JSONs", nonempty=False)
    vl_checklist_object: tuple[str, ...] = opt((), "VL-CheckList Object data JSONs", nonempty=False)
    sugarcrepe_root: str | None = _path("SugarCrepe image root (COCO val2017/ images)")
    sugarcrepe: tuple[str, ...] = opt((), "SugarCrepe JSONs (replace_att.json, swap_obj.json, ...)", nonempty=False)
    aro_root: str | None = _path("ARO image root (Visual Genome images)")
    aro_relation: str | None = _path("ARO visual_genome_relation.json")
    aro_attribution: str | None = _path("ARO visual_genome_attribution.json")


# recipe -> (data class, the layouts it reads, one line on what it runs)
REAL_RECIPES = {
    "tevi-coco": (TeviCocoData, ("coco", "table", "shards", "flickr", "long", "rococo"),
                  ("TEVI (SAE + caption-conditioned mask) trained on COCO / CC12M pairs; retrieval on COCO, "
                   "Flickr30k, DOCCI, IIW; RoCOCO")),
    "controlembed-clevr4": (Clevr4Data, ("clevr4",), "ControlEmbed on Clevr-4 (color, shape, texture, count)"),
    "controlembed-stanford40": (Stanford40Data, ("stanford40",), "ControlEmbed on Stanford 40 (action, location, mood)"),
    "controlembed-shotbench": (ShotBenchData, ("shotbench",), "ControlEmbed on ShotBench (shot size, camera angle, ...)"),
    "3vl-coco": (ThreeVLCocoData, ("coco", "vl_checklist", "sugarcrepe", "aro"),
                 ("3VL tree-loss LoRA on COCO train captions vs contrastive and NegCLIP; VL-CheckList, SugarCrepe, "
                  "ARO")),
}


def need_dir(value: str | None, flag: str, layout: str) -> Path:
    """`value` as an existing directory, or one error naming the flag and the expected layout."""
    if not value:
        raise VlctlError(f"{flag} not given; expected {LAYOUTS[layout]}")
    p = Path(value).expanduser()
    if not p.is_dir():
        raise VlctlError(f"{p}: dataset root not found ({flag}); expected {LAYOUTS[layout]}")
    return p


def need_file(value: str | None, flag: str, layout: str) -> Path:
    """`value` as an existing file, or one error naming the flag and the expected layout."""
    if not value:
        raise VlctlError(f"{flag} not given; expected {LAYOUTS[layout]}")
    p = Path(value).expanduser()
    if not p.is_file():
        raise VlctlError(f"{p}: annotation file not found ({flag}); expected {LAYOUTS[layout]}")
    return p


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")
