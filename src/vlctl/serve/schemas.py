"""The pydantic models of `vlctl serve`'s JSON API: every request is checked against them (sizes,
k ranges, attribute strings) before any work, and every answer is one of them (OpenAPI at /docs)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_K = 200  # results per query
MAX_CANDIDATES = 1000  # what a TEVI rerank re-scores
MAX_TEXT = 300  # characters of a query or caption
MAX_CLUSTERS = 256
MAX_PER_CLUSTER = 64

# Printable text without control characters (a query, a caption); an attribute is a short phrase.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"  # (not \S: it takes a control char)
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT, pattern=TEXT_PATTERN)]
Attribute = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _'-]*$")]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Row = Annotated[int, Field(ge=0, le=2**40)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(BaseModel):
    """Every error answer: one clear message."""

    error: str


class Hit(BaseModel):
    id: int = Field(description="row of the collection; its image is /api/images/{collection}/{id}")
    score: float | None = Field(None, description="the query's score (a latent's top image: its activation)")
    label: str | None = Field(None, description="its caption or labels")
    file: str | None = Field(None, description="the name of its image file (null: the row is no file)")
    path: str | None = Field(None, description="the file's path as the store records it")


class SearchRequest(_Strict):
    """Search by text or by a stored image (exactly one)."""

    collection: Name
    text: Text | None = None
    image_id: Row | None = None
    k: int = Field(24, ge=1, le=MAX_K)

    @model_validator(mode="after")
    def _one_query(self):
        if (self.text is None) == (self.image_id is None):
            raise ValueError("give exactly one of text and image_id")
        return self


class SearchResponse(BaseModel):
    collection: str
    query: dict
    hits: list[Hit]


class SteerRequest(_Strict):
    """ControlEmbed steering: the query's embedding through the attribute's affine map (with
    `attribute_b`, the blend alpha (q W_a + b_a) + (1 - alpha) (q W_b + b_b)); or, with `tevi`, the
    top `candidates` of a text query re-scored by TEVI's caption-conditioned score."""

    collection: Name
    text: Text | None = None
    image_id: Row | None = None
    attribute: Attribute | None = None
    attribute_b: Attribute | None = None
    alpha: float = Field(1.0, ge=0.0, le=1.0)
    tevi: bool = False
    candidates: int = Field(100, ge=1, le=MAX_CANDIDATES)
    k: int = Field(24, ge=1, le=MAX_K)

    @model_validator(mode="after")
    def _check(self):
        if (self.text is None) == (self.image_id is None):
            raise ValueError("give exactly one of text and image_id")
        if self.tevi:
            if self.text is None:
                raise ValueError("tevi: the TEVI rerank conditions on a text query; give text")
            if self.attribute is not None or self.attribute_b is not None:
                raise ValueError("tevi: give no attribute (TEVI reranks by the caption, not by an attribute)")
        elif self.attribute is None:
            raise ValueError("give an attribute to steer by, or tevi=true")
        if self.attribute_b is not None and self.attribute is None:
            raise ValueError("attribute_b blends with attribute; give attribute too")
        return self


class LatentUse(BaseModel):
    latent: int
    name: str | None
    value: float = Field(description="the latent's activation in the image")
    mask: float = Field(description="the caption's mask value of the latent, in [0, 1]")


class SteerHit(Hit):
    before_rank: int | None = Field(None, description="TEVI: rank by the plain cosine (1 = first)")
    before_score: float | None = Field(None, description="TEVI: the plain cosine")
    moved: bool = Field(False, description="TEVI: off the longest run of results still in their cosine order "
                        "(the fewest results whose moves make the new order)")
    kept: list[LatentUse] = Field([], description="TEVI: the image's active SAE latents the caption's mask keeps")
    dropped: list[LatentUse] = Field([], description="TEVI: those it drops (mask < 0.5)")


class SteerResponse(BaseModel):
    collection: str
    query: dict
    mode: Literal["attribute", "compose", "tevi"]
    note: str = ""
    hits: list[SteerHit]


class ClusterRequest(_Strict):
    collection: Name
    attribute: Attribute
    k: int | None = Field(None, ge=1, le=MAX_CLUSTERS, description="clusters (default: the subclass count)")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    per_cluster: int = Field(12, ge=1, le=MAX_PER_CLUSTER)


class ClusterInfo(BaseModel):
    id: int
    size: int
    subclass: str | None = None
    nearest: list[int]
    images: list[Hit] = Field([], description="the nearest rows as the page shows them (file names, captions)")


class ClusterResult(BaseModel):
    collection: str
    attribute: str
    k: int
    n_images: int
    seconds: float
    clusters: list[ClusterInfo]


class LatentsRequest(_Strict):
    collection: Name


class LatentsSummary(BaseModel):
    """The latents job's result: `SparseAutoencoder.describe`'s summary (counts, the top names' AUCs
    and the shuffled-decoder control)."""

    collection: str
    summary: dict
    live: int


class LatentName(BaseModel):
    name: str
    cosine: float
    margin: float | None
    auc: float | None = Field(description="AUC of the activation for images whose caption mentions the name")


class Latent(BaseModel):
    latent: int
    live: bool
    frequency: float = Field(description="share of the images it fires on")
    mean_activation: float
    names: list[LatentName]
    top_images: list[int]
    top_values: list[float]


class LatentList(BaseModel):
    collection: str
    total: int = Field(description="latents matching the query (all live ones without)")
    offset: int
    latents: list[Latent]


class LatentDetail(Latent):
    collection: str
    hits: list[Hit] = Field(description="its top images, the activation as score")


class Job(BaseModel):
    id: str
    status: Literal["queued", "running", "done", "failed"]
    result: ClusterResult | LatentsSummary | None = None
    error: str | None = None


class ExplainRequest(_Strict):
    image_id: Row
    positive: Text
    negative: Text | None = None
    tree: bool = True


class ExplainUploadForm(_Strict):
    """The form fields of /api/explain/upload (beside the file)."""

    positive: Text
    negative: Text | None = None
    tree: bool = True


class Heatmap(BaseModel):
    method: str
    title: str
    image: str = Field(description="PNG data URL: the map over the image, upscaled")


class ColourBar(BaseModel):
    method: str
    label: str
    vmin: float
    vmax: float
    image: str


class TreeLevel(BaseModel):
    positive: str
    positive_score: float
    negatives: list[str]
    negative_scores: list[float]
    fails: list[bool] = Field(description="per negative: the model scores it at least as high as the positive")


class ModelExplanation(BaseModel):
    model: str
    encoder_id: str
    positive_score: float
    negative_score: float | None = None
    anchor_text: str | None = None
    heatmaps: list[Heatmap]
    tree: list[TreeLevel] | None = None


class ExplainResponse(BaseModel):
    image_id: int | None = Field(description="the explain set's row; null for an uploaded image")
    positive: str
    negative: str | None
    image: str
    models: list[ModelExplanation]
    colour_bars: list[ColourBar]
    seconds: float
    tree_note: str = ""


class CollectionInfo(BaseModel):
    name: str
    size: int
    encoder_id: str
    description: str
    thumbnails: bool
    text_queries: bool
    attributes: list[str]
    subclasses: dict[str, list[str]]
    free_text_attributes: bool
    tevi: bool
    tevi_note: str = Field("", description="TEVI's held-out figures and fusion weight, the line its rerank shows")
    sae: bool = Field(False, description="an SAE is served (the TEVI model's): its latents can be listed")


class ExplainInfo(BaseModel):
    name: str
    size: int
    models: list[str]
    trees: bool
    examples: list[dict]


class ReportInfo(BaseModel):
    id: str
    title: str
    url: str
    figures: list[str]


class Info(BaseModel):
    title: str
    collections: list[CollectionInfo]
    explain: ExplainInfo | None
    reports: list[ReportInfo]
    limits: dict
