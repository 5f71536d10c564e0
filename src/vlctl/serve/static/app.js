// vlctl serve: the page. Plain JS, no build. Every server string goes in through textContent.
"use strict";

const $ = (id) => document.getElementById(id);
let INFO = null;

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function status(msg, error = false) {
  const s = $("status");
  s.textContent = msg;
  s.className = error ? "error" : "";
}

async function api(path, body, isForm = false) {
  const opts = body === undefined ? {} : {
    method: "POST",
    body: isForm ? body : JSON.stringify(body),
    headers: isForm ? {} : { "Content-Type": "application/json" },
  };
  const r = await fetch(path, opts);
  let data = null;
  try { data = await r.json(); } catch (e) { data = { error: `HTTP ${r.status}` }; }
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}

const imgUrl = (source, id, size = 128) => `/api/images/${encodeURIComponent(source)}/${id}?size=${size}`;

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
// What names a row: its file's name; a row that is no file (a generated set) by its row number.
const nameOf = (hit) => hit.file || `row ${hit.id}`;
const titleOf = (hit) => [hit.path || nameOf(hit), hit.label].filter((x) => x).join("\n");

function hitButton(source, hit, onPick, extra) {
  const b = el("button", { type: "button", class: "hit", "data-id": String(hit.id), title: titleOf(hit) },
    el("img", { src: imgUrl(source, hit.id), alt: hit.label || nameOf(hit), loading: "lazy" }),
    el("span", { class: "file", text: nameOf(hit) }));
  if (hit.score != null) b.append(el("span", { class: "score", text: hit.score.toFixed(3) }));
  if (extra) b.append(extra);
  if (hit.label) b.append(el("span", { class: "label", text: hit.label }));
  b.addEventListener("click", () => onPick(hit.id, hit));
  return b;
}

// A failed request leaves no earlier answer on the page under its message.
function failed(e, ...containers) {
  for (const c of containers) c.replaceChildren();
  status(e.message, true);
}

// -- tabs: Tab reaches each tab button, Enter/Space opens it, arrows move between them -------------
const TABS = ["search", "steer", "clusters", "explain", "latents", "reports"];
function openTab(name, focus = false) {
  for (const t of TABS) {
    const on = t === name;
    $(`tab-${t}`).setAttribute("aria-selected", String(on));
    $(`panel-${t}`).hidden = !on;
  }
  if (focus) $(`tab-${name}`).focus();
  status("");
  history.replaceState(null, "", `#${name}`);
  if (name === "latents") latentsOpen();
}
TABS.forEach((t, i) => {
  const b = $(`tab-${t}`);
  b.addEventListener("click", () => openTab(t));
  b.addEventListener("keydown", (e) => {
    if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      const j = (i + (e.key === "ArrowRight" ? 1 : TABS.length - 1)) % TABS.length;
      openTab(TABS[j], true);
      e.preventDefault();
    }
  });
});

function fillSelect(sel, names) {
  sel.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
}

async function picks(source, container, onPick, seed = 0, n = 12) {
  container.replaceChildren();
  if (!source) return;
  const { items } = await api(`/api/sample/${encodeURIComponent(source)}?n=${n}&seed=${seed}`);
  container.replaceChildren(...items.map((it) => hitButton(source, it, onPick)));
}

// -- Search --------------------------------------------------------------------------------------
async function search(body) {
  const coll = $("search-collection").value;
  status("searching\u2026");
  try {
    const r = await api("/api/search", { collection: coll, k: 24, ...body });
    $("search-heading").textContent = r.query.text !== undefined ? `Results for \u201c${r.query.text}\u201d`
      : `Images like ${nameOf({ id: r.query.image_id, file: r.query.file })}`;
    showHits($("search-results"), coll, r.hits, (id) => search({ image_id: id }));
    status(plural(r.hits.length, "result"));
  } catch (e) { $("search-heading").textContent = "Results"; failed(e, $("search-results")); }
}

function showHits(container, source, hits, onPick, extra) {
  container.replaceChildren(...hits.map((h) => {
    const b = hitButton(source, h, onPick, extra ? extra(h) : null);
    if (h.moved) b.classList.add("moved");
    return b;
  }));
}

$("search-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("search-text").value.trim();
  if (text) search({ text }); else status("type a text, or pick an image", true);
});
$("upload-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const f = $("search-file").files[0];
  if (!f) { status("choose an image file first", true); return; }
  const form = new FormData();
  form.append("file", f);
  form.append("collection", $("search-collection").value);
  form.append("k", "24");
  status("searching by the uploaded image\u2026");
  try {
    const r = await api("/api/search/upload", form, true);
    const coll = $("search-collection").value;
    $("search-heading").textContent = `Images like the uploaded ${f.name}`;
    showHits($("search-results"), coll, r.hits, (id) => search({ image_id: id }));
    status(plural(r.hits.length, "result"));
  } catch (err) { $("search-heading").textContent = "Results"; failed(err, $("search-results")); }
});
$("search-collection").addEventListener("change", () =>
  picks($("search-collection").value, $("search-picks"), (id) => search({ image_id: id })));

// -- Steer ---------------------------------------------------------------------------------------
function steerCollection() { return INFO.collections.find((c) => c.name === $("steer-collection").value); }

function steerSetup() {
  const c = steerCollection();
  if (!c) return;
  $("steer-attributes").replaceChildren(...c.attributes.map((a) => el("option", { value: a })));
  if (!c.attributes.includes($("steer-attribute").value)) $("steer-attribute").value = c.attributes[0] || "";
  $("steer-tevi").disabled = !c.tevi;
  $("steer-tevi").checked = c.tevi && !c.attributes.length;
  $("steer-attribute").disabled = !c.attributes.length;
  $("steer-attribute-b").disabled = !c.attributes.length;
  alphaLabel();
  $("steer-note").textContent = (c.attributes.length ? `attributes: ${c.attributes.join(", ")}` +
    (c.free_text_attributes ? " (or type any attribute: MiniLM embeds it)" : "") : "") +
    (c.tevi ? (c.attributes.length ? " \u00b7 " : "") + "TEVI: a text query, its top 100 re-scored by the caption. " +
      c.tevi_note : "");
  $("steer-picker").hidden = !c.attributes.length;  // TEVI alone steers by a text, not by an image
  steerPicks(0);
}

function steerPick(id, hit) {
  $("steer-image-id").value = id;
  $("steer-text").value = "";
  if ($("steer-tevi").checked && steerCollection().attributes.length) $("steer-tevi").checked = false;
  showPicked("steer", steerCollection().name, hit || { id });
  steer();
}

function steerPicks(seed) { picks(steerCollection().name, $("steer-picks"), steerPick, seed); }

// The picked query image with its file name beside the form (steer-picked / explain-picked).
function showPicked(which, source, hit) {
  const img = $(which === "steer" ? "steer-query-img" : "explain-picked-img");
  img.src = imgUrl(source, hit.id, 96);
  $(`${which}-picked`).title = titleOf(hit);
  $(`${which}-picked-name`).textContent = nameOf(hit);
  $(`${which}-picked`).hidden = false;
}

// The slider weighs the first attribute against the second: say which.
function alphaLabel() {
  const a = $("steer-attribute").value.trim(), b = $("steer-attribute-b").value.trim();
  $("steer-alpha-label").textContent = b ? `\u03b1: weight of \u201c${a}\u201d (1 \u2212 \u03b1: \u201c${b}\u201d)`
    : "\u03b1: weight of the attribute (blend: pick a second one)";
  $("steer-alpha").disabled = !b;
}

// A TEVI result's named SAE latents: those the caption's mask kept, and those it dropped.
function latentLine(h) {
  const part = (rows) => rows.map((l) => l.name || `#${l.latent}`).join(", ") || "none";
  const box = el("span", { class: "latent-use" });
  if (h.kept.length || h.dropped.length) {
    box.append(el("span", { class: "kept", text: `kept: ${part(h.kept)}` }), el("span", { class: "dropped", text: `dropped: ${part(h.dropped)}` }));
    box.title = [...h.kept.map((l) => `kept ${l.name || "#" + l.latent}: activation ${l.value.toFixed(2)}, mask ${l.mask.toFixed(2)}`),
      ...h.dropped.map((l) => `dropped ${l.name || "#" + l.latent}: activation ${l.value.toFixed(2)}, mask ${l.mask.toFixed(2)}`)].join("\n");
  }
  return box;
}

async function steer() {
  const c = steerCollection();
  const tevi = $("steer-tevi").checked;
  const text = $("steer-text").value.trim();
  const body = { collection: c.name, k: 24, tevi };
  if (tevi) {
    if (!text) { status("the TEVI rerank needs a text query", true); return; }
    body.text = text;
  } else {
    if (text) body.text = text; else body.image_id = Number($("steer-image-id").value || 0);
    body.attribute = $("steer-attribute").value.trim();
    const b = $("steer-attribute-b").value.trim();
    if (b) { body.attribute_b = b; body.alpha = Number($("steer-alpha").value); }
  }
  if (body.image_id === undefined) $("steer-picked").hidden = true;
  status("steering\u2026");
  try {
    const r = await api("/api/steer", body);
    if (body.image_id !== undefined) showPicked("steer", c.name, { id: body.image_id, file: r.query.file, path: r.query.path });
    const extra = r.mode === "tevi" ? (h) => el("span", { class: "move" },
      el("span", { text: `CLIP #${h.before_rank} ${h.before_score.toFixed(3)} \u2192 ${h.score.toFixed(3)}` }), latentLine(h)) : null;
    showHits($("steer-results"), c.name, r.hits, (id, hit) => {
      $("steer-tevi").checked = false; steerPick(id, hit);
    }, extra);
    $("steer-heading").textContent = body.text !== undefined ? `Results for \u201c${body.text}\u201d`
      : `Images like ${nameOf({ id: body.image_id, file: r.query.file })} by ${body.attribute}` + (body.attribute_b ? ` and ${body.attribute_b}` : "");
    const moved = r.hits.filter((h) => h.moved).length;
    status((r.mode === "tevi" ? `TEVI: ${moved} of ${plural(r.hits.length, "result")} moved against the CLIP order` : `${r.mode}: ${plural(r.hits.length, "result")}`) +
      (r.note ? ` \u00b7 ${r.note}` : ""));
  } catch (e) { $("steer-heading").textContent = "Results"; failed(e, $("steer-results")); }
}
$("steer-form").addEventListener("submit", (e) => { e.preventDefault(); steer(); });
$("steer-collection").addEventListener("change", steerSetup);
$("steer-attribute").addEventListener("change", () => { alphaLabel(); steer(); });
$("steer-attribute-b").addEventListener("input", alphaLabel);
$("steer-attribute").addEventListener("input", alphaLabel);
$("steer-more").addEventListener("click", () => steerPicks(Math.floor(Math.random() * 1e9)));
$("steer-alpha").addEventListener("input", () => { $("steer-alpha-value").textContent = Number($("steer-alpha").value).toFixed(2); });
$("steer-alpha").addEventListener("change", () => { if ($("steer-attribute-b").value.trim()) steer(); });

// -- Clusters ------------------------------------------------------------------------------------
function clusterSetup() {
  const c = INFO.collections.find((x) => x.name === $("cluster-collection").value);
  fillSelect($("cluster-attribute"), c ? c.attributes : []);
}

async function cluster() {
  const coll = $("cluster-collection").value;
  const body = { collection: coll, attribute: $("cluster-attribute").value, per_cluster: 12 };
  if ($("cluster-k").value) body.k = Number($("cluster-k").value);
  $("cluster-status").textContent = "clustering in the background\u2026";
  try {
    let job = await api("/api/cluster", body);
    while (job.status === "queued" || job.status === "running") {
      await new Promise((r) => setTimeout(r, 250));
      job = await api(`/api/jobs/${job.id}`);
    }
    if (job.status === "failed") throw new Error(job.error);
    const r = job.result;
    $("cluster-status").textContent = `${plural(r.n_images, "image")} in ${plural(r.k, "cluster")} by ${r.attribute} (${r.seconds.toFixed(2)} s)`;
    $("cluster-results").replaceChildren(...r.clusters.map((cl) => el("div", { class: "cluster" },
      el("h3", { text: (cl.subclass ? `${cl.subclass} \u00b7 ` : "") + `cluster ${cl.id} \u00b7 ${plural(cl.size, "image")}` }),
      el("div", { class: "strip" }, ...cl.images.map((h) => hitButton(coll, h, (i) => {
        openTab("search"); $("search-collection").value = coll; search({ image_id: i });
      }))))));
    status("clusters ready");
  } catch (e) { $("cluster-status").textContent = ""; failed(e, $("cluster-results")); }
}
$("cluster-form").addEventListener("submit", (e) => { e.preventDefault(); cluster(); });
$("cluster-collection").addEventListener("change", clusterSetup);
$("cluster-attribute").addEventListener("change", cluster);

// -- Explain -------------------------------------------------------------------------------------
function explainPick(id, hit) {
  $("explain-id").value = id;
  $("explain-file").value = "";  // a picked image replaces an uploaded one
  const ex = hit || INFO.explain.examples.find((x) => x.id === id) || { id };
  const caption = ex.caption || ex.label;
  if (caption) $("explain-positive").value = caption;
  showPicked("explain", "explain", ex);
}

function explainPicks(seed) {
  picks("explain", $("explain-picks"), explainPick, seed, 24);
}

async function explain() {
  const body = { image_id: Number($("explain-id").value || 0), positive: $("explain-positive").value.trim() };
  const neg = $("explain-negative").value.trim();
  if (neg) body.negative = neg;
  if (!body.positive) { status("give a positive caption", true); return; }
  const file = $("explain-file").files[0];
  status("computing relevancy maps\u2026");
  try {
    let r;
    if (file) {  // the upload is typed and limited by the server, as in Search
      const form = new FormData();
      form.append("file", file);
      form.append("positive", body.positive);
      if (body.negative) form.append("negative", body.negative);
      r = await api("/api/explain/upload", form, true);
    } else {
      r = await api("/api/explain", body);
    }
    $("explain-heading").textContent = `Explained: ${file ? file.name : $("explain-picked-name").textContent || nameOf({ id: body.image_id })}`;
    $("explain-heading").hidden = false;
    const bars = el("div", { class: "bars" }, ...r.colour_bars.map((b) => el("figure", {},
      el("img", { src: b.image, alt: `colour bar: ${b.label}` }),
      el("div", { class: "ends" }, el("span", { text: b.vmin.toPrecision(3) }), el("span", { text: b.vmax.toPrecision(3) })),
      el("figcaption", { text: b.label }))));
    const models = r.models.map((m) => {
      const box = el("div", { class: "model" },
        el("h3", { text: m.model }),
        el("p", { class: m.negative_score != null && m.negative_score >= m.positive_score ? "hint fail" : "hint",
          text: `P ${m.positive_score.toFixed(3)}` + (m.negative_score != null ? ` \u00b7 N ${m.negative_score.toFixed(3)}` +
            (m.negative_score >= m.positive_score ? " \u2717 prefers N" : " \u2713 prefers P") : "") +
          (m.anchor_text ? ` \u00b7 anchor \u201c${m.anchor_text}\u201d` : "") }),
        el("div", { class: "heatmaps" }, ...m.heatmaps.map((h) => el("figure", {},
          el("img", { class: "heatmap", src: h.image, alt: `${m.model}: ${h.title}` }), el("figcaption", { text: h.title })))));
      if (m.tree) {
        const rows = m.tree.map((lv, i) => el("tr", {},
          el("td", { text: `L${i + 1}` }),
          el("td", { text: `${lv.positive} (${lv.positive_score.toFixed(3)})` }),
          el("td", {}, ...lv.negatives.map((n, j) => el("div", { class: lv.fails[j] ? "fail" : "ok",
            text: `${lv.fails[j] ? "\u2717" : "\u2713"} ${n} (${lv.negative_scores[j].toFixed(3)})` })))));
        box.append(el("table", { class: "tree" },
          el("thead", {}, el("tr", {}, el("th", { text: "level" }), el("th", { text: "positive (score)" }),
            el("th", { text: "negatives (\u2717: scored \u2265 the positive)" }))), el("tbody", {}, ...rows)));
      }
      return box;
    });
    $("explain-results").replaceChildren(...[
      el("div", { class: "row" }, el("img", { src: r.image, alt: r.image_id == null ? "the uploaded image" : `image ${r.image_id}`, class: "heatmap", width: "192", height: "192" }), bars),
      r.tree_note ? el("p", { class: "hint", text: r.tree_note }) : null,
      el("div", { class: "models" }, ...models)].filter((x) => x));
    status(`explained in ${r.seconds.toFixed(2)} s`);
  } catch (e) { $("explain-heading").hidden = true; failed(e, $("explain-results")); }
}
$("explain-form").addEventListener("submit", (e) => { e.preventDefault(); explain(); });
$("explain-file").addEventListener("change", () => { $("explain-picked").hidden = !!$("explain-file").files.length; });
$("explain-more").addEventListener("click", () => explainPicks(Math.floor(Math.random() * 1e9)));
$("explain-id").addEventListener("change", () => explainPick(Number($("explain-id").value || 0)));

// -- Latents: the served SAE's latents, named; described once per collection on a background job -----
const LATENTS = { summaries: {}, offset: 0, timer: null };

async function latentsOpen() {
  const coll = $("latents-collection").value;
  if (!coll) {
    $("latents-summary").textContent = "No SAE is served: start the page with \u201cvlctl serve STORE --tevi TEVI_DIR\u201d; " +
      "its SAE's latents are listed here.";
    return;
  }
  try {
    if (!LATENTS.summaries[coll]) {
      $("latents-summary").textContent = "naming the SAE's latents (once; a large store takes minutes)\u2026";
      let job = await api("/api/latents", { collection: coll });
      while (job.status === "queued" || job.status === "running") {
        await new Promise((r) => setTimeout(r, 250));
        job = await api(`/api/jobs/${job.id}`);
      }
      if (job.status === "failed") throw new Error(job.error);
      LATENTS.summaries[coll] = job.result.summary;
    }
    const s = LATENTS.summaries[coll];
    $("latents-summary").textContent = `${plural(s.live, "live latent")} of ${s.n_latents} (${s.dead} dead) over ` +
      `${plural(s.n_images, "image")}; names from ${plural(s.vocabulary, "phrase")} of the ${s.vocabulary_source}` +
      (s.top_name && s.top_name.auc_median != null ? `; median AUC of the top names ${s.top_name.auc_median.toFixed(2)} ` +
        `(shuffled decoder: ${s.shuffled_decoder.auc_median.toFixed(2)})` : "");
    if (!$("latents-list").children.length) latentsList(0);
  } catch (e) { $("latents-summary").textContent = ""; failed(e, $("latents-list"), $("latent-images")); }
}

async function latentsList(offset) {
  const coll = $("latents-collection").value;
  const q = $("latents-q").value.trim();
  try {
    const r = await api(`/api/latents/${encodeURIComponent(coll)}?limit=50&offset=${offset}` + (q ? `&q=${encodeURIComponent(q)}` : ""));
    const rows = r.latents.map((l) => {
      const [top, ...rest] = l.names;
      const b = el("button", { type: "button", class: "latent", "data-latent": String(l.latent), onclick: () => latentOpen(l.latent) },
        el("span", { class: "name", text: top ? top.name : `latent ${l.latent}` }),
        el("span", { class: "hint", text: `#${l.latent} \u00b7 fires on ${(100 * l.frequency).toFixed(1)}% \u00b7 ` +
          (top ? `cos ${top.cosine.toFixed(2)}` + (top.margin != null ? `, margin ${top.margin.toFixed(2)}` : "") +
            (top.auc != null ? `, AUC ${top.auc.toFixed(2)}` : "") : "") }),
        el("span", { class: "hint others", text: rest.length ? `also: ${rest.map((n) => n.name).join(", ")}` : "" }),
        el("span", { class: "thumbs" }, ...l.top_images.map((i) => el("img", { src: imgUrl(coll, i, 64), alt: "", loading: "lazy" }))));
      return b;
    });
    if (offset === 0) $("latents-list").replaceChildren(...rows); else $("latents-list").append(...rows);
    LATENTS.offset = offset + r.latents.length;
    $("latents-more").hidden = LATENTS.offset >= r.total;
    status(q ? `${plural(r.total, "latent")} named like \u201c${q}\u201d` : plural(r.total, "live latent"));
  } catch (e) { failed(e, $("latents-list")); }
}

async function latentOpen(latent) {
  const coll = $("latents-collection").value;
  try {
    const r = await api(`/api/latents/${encodeURIComponent(coll)}/${latent}`);
    $("latent-heading").textContent = `Latent #${r.latent}` + (r.names.length ? `: ${r.names[0].name}` : "") +
      ` \u00b7 its top ${plural(r.hits.length, "image")} (score: activation)`;
    $("latent-heading").hidden = false;
    showHits($("latent-images"), coll, r.hits, (id) => { openTab("search"); $("search-collection").value = coll; search({ image_id: id }); });
    $("latent-heading").scrollIntoView({ block: "nearest" });
  } catch (e) { $("latent-heading").hidden = true; failed(e, $("latent-images")); }
}

$("latents-form").addEventListener("submit", (e) => { e.preventDefault(); latentsList(0); });
$("latents-q").addEventListener("input", () => { clearTimeout(LATENTS.timer); LATENTS.timer = setTimeout(() => latentsList(0), 250); });
$("latents-more").addEventListener("click", () => latentsList(LATENTS.offset));
$("latents-collection").addEventListener("change", () => { $("latents-list").replaceChildren(); latentsOpen(); });

// -- Reports -------------------------------------------------------------------------------------
function reportsSetup() {
  const list = $("report-list");
  if (!INFO.reports.length) {
    list.replaceChildren(el("p", { class: "empty", text: "No reports are served. To make one, run a recipe, e.g. " +
      "\u201cvlctl reproduce controlembed-shapes --out runs/reports\u201d (vlctl reproduce --help lists them), then start " +
      "the page with \u201cvlctl serve STORE --reports runs/reports\u201d (make demo serves its own)." }));
    return;
  }
  list.replaceChildren(...INFO.reports.map((r) => el("button", { type: "button", "data-report": r.id, text: r.title,
    onclick: () => { $("report-frame").src = r.url; } })));
  $("report-frame").hidden = false;
  $("report-frame").src = INFO.reports[0].url;
}

// -- start ---------------------------------------------------------------------------------------
(async function start() {
  try {
    INFO = await api("/api/info");
  } catch (e) { status(e.message, true); return; }
  $("title").textContent = INFO.title;
  const names = INFO.collections.map((c) => c.name);
  fillSelect($("search-collection"), names);
  fillSelect($("steer-collection"), INFO.collections.filter((c) => c.attributes.length || c.tevi).map((c) => c.name));
  fillSelect($("cluster-collection"), INFO.collections.filter((c) => c.attributes.length).map((c) => c.name));
  picks(names[0], $("search-picks"), (id) => search({ image_id: id }));
  fillSelect($("latents-collection"), INFO.collections.filter((c) => c.sae).map((c) => c.name));
  steerSetup();
  clusterSetup();
  if (INFO.explain) {
    $("explain-picks").replaceChildren(...INFO.explain.examples.map((x) =>
      hitButton("explain", { ...x, label: x.caption }, explainPick)));
    if (INFO.explain.examples.length) explainPick(INFO.explain.examples[0].id);
  } else {
    $("explain-results").replaceChildren(el("p", { class: "hint", text: "nothing to explain: the encoder has no ViT image tower" }));
  }
  reportsSetup();
  const want = location.hash.slice(1);
  openTab(TABS.includes(want) ? want : "search");
  status("ready");
})();
