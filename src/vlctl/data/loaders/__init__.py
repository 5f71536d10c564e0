"""Loaders for image-text data in the formats it is published in, read unchanged.

Every loader returns an `ImageTextData`: unique images (paths relative to `root`, as the file
writes them), all captions in file order, `image_of_text` mapping each caption to its image (the
array `vlctl.eval.metrics.recall_at_k` takes), and per-image fields (split, ids, attributes).

    load_karpathy("dataset_coco.json", split="test", root="coco/")      Karpathy COCO / Flickr30k
    load_karpathy("coco_karpathy_test.json", root="coco/")              [{image, caption: [...]}]
    load_caption_table("train.tsv", root="imgs/")                       OpenCLIP-style CSV / TSV
    load_image_folder("photos/", annotations="labels.csv")              a folder + CSV/JSONL
    load_clevr4("clevr_4_10k_v1/", split="val")                         Clevr-4 taxonomies per image
    load_sugarcrepe("replace_att.json"), load_vl_checklist("x.json")    (image, positive, negative)
    load_aro("visual_genome_relation.json")                             the same, with ARO's bbox crop
    load_rococo("same_concept.json")                                    5 original + 5 altered
    load_long_captions("iiw_docci_test.jsonl", field="DOCCI")           IIW / DOCCI descriptions
    iter_webdataset("shards/{00000..00031}.tar")                        img2dataset tar shards, streamed
    unpack_webdataset("shards/{00000..00031}.tar", "unpacked/")         ... as image files + captions

Missing images: with `root` given, every image path is checked. `on_missing="error"` (default)
raises a VlctlError saying how many are missing, which ones (the first 10) and the root looked in;
"skip" drops them (and their captions) and records them in `.missing`; `root=None` loads the
text only, without checking (caption-only uses: trees, negatives, text embeddings).

Modules: common (ImageTextData, the missing-file check, the CSV / TSV / JSONL table reader),
retrieval (Karpathy, RoCOCO, long captions), folder (caption tables, image folders, Clevr-4),
compositional (SugarCrepe, VL-CheckList, ARO), webdataset (tar shards), labelled
(LabelledImages, Stanford 40, ShotBench). Each name is imported from its module.
"""
