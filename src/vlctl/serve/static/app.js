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

function hitButton(source, hit, onPick, extra) {
  const b = el("button", { type: "button", class: "hit", "data-id": String(hit.id), title: hit.label || `image ${hit.id}` },
    el("img", { src: imgUrl(source, hit.id), alt: hit.label || `image ${hit.id}`, loading: "lazy" }));
  if (hit.score !== undefined) b.append(el("span", { class: "score", text: hit.score.toFixed(3) }));
  if (extra) b.append(extra);
  if (hit.label) b.append(el("span", { class: "label", text: hit.label }));
  b.addEventListener("click", () => onPick(hit.id));
  return b;
}

// -- tabs: Tab reaches each tab button, Enter/Space opens it, arrows move between them -------------
const TABS = ["search", "steer", "clusters", "explain", "reports"];
function openTab(name, focus = false) {
  for (const t of TABS) {
    const on = t === name;
    $(`tab-${t}`).setAttribute("aria-selected", String(on));
    $(`panel-${t}`).hidden = !on;
  }
  if (focus) $(`tab-${name}`).focus();
  status("");
  history.replaceState(null, "", `#${name}`);
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

async function picks(source, container, onPick, n = 12) {
  container.replaceChildren();
  if (!source) return;
  const { ids } = await api(`/api/sample/${encodeURIComponent(source)}?n=${n}`);
  container.replaceChildren(...ids.map((id) => hitButton(source, { id }, onPick)));
}

// -- Search --------------------------------------------------------------------------------------
async function search(body) {
  const coll = $("search-collection").value;
  status("searching\u2026");
  try {
    const r = await api("/api/search", { collection: coll, k: 24, ...body });
    $("search-heading").textContent = r.query.text !== undefined ? `Results for \u201c${r.query.text}\u201d`
      : `Images like image ${r.query.image_id}`;
    showHits($("search-results"), coll, r.hits, (id) => search({ image_id: id }));
    status(`${r.hits.length} results`);
  } catch (e) { status(e.message, true); }
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
    status(`${r.hits.length} results`);
  } catch (err) { status(err.message, true); }
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
  $("steer-note").textContent = (c.attributes.length ? `attributes: ${c.attributes.join(", ")}` +
    (c.free_text_attributes ? " (or type any attribute: MiniLM embeds it)" : "") : "") +
    (c.tevi ? (c.attributes.length ? " \u00b7 " : "") + "TEVI: a text query, its top 100 re-scored by the caption. " +
      c.tevi_note : "");
  picks(c.name, $("steer-picks"), (id) => { $("steer-image-id").value = id; $("steer-text").value = ""; steer(); });
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
  const q = $("steer-query-img");
  q.hidden = body.image_id === undefined;
  if (!q.hidden) q.src = imgUrl(c.name, body.image_id, 96);
  status("steering\u2026");
  try {
    const r = await api("/api/steer", body);
    const extra = r.mode === "tevi" ? (h) => el("span", { class: "move",
      text: `#${h.before_rank} ${h.before_score.toFixed(3)} \u2192 ${h.score.toFixed(3)}` }) : null;
    showHits($("steer-results"), c.name, r.hits, (id) => {
      $("steer-image-id").value = id; $("steer-text").value = ""; $("steer-tevi").checked = false; steer();
    }, extra);
    const moved = r.hits.filter((h) => h.moved).length;
    status((r.mode === "tevi" ? `TEVI: ${moved} of ${r.hits.length} results moved` : `${r.mode}: ${r.hits.length} results`) +
      (r.note ? ` \u00b7 ${r.note}` : ""));
  } catch (e) { status(e.message, true); }
}
$("steer-form").addEventListener("submit", (e) => { e.preventDefault(); steer(); });
$("steer-collection").addEventListener("change", steerSetup);
$("steer-attribute").addEventListener("change", () => steer());
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
    $("cluster-status").textContent = `${r.n_images} images in ${r.k} clusters by ${r.attribute} (${r.seconds.toFixed(2)} s)`;
    $("cluster-results").replaceChildren(...r.clusters.map((cl) => el("div", { class: "cluster" },
      el("h3", { text: `cluster ${cl.id} \u00b7 ${cl.size} images` + (cl.subclass ? ` \u00b7 nearest subclass: ${cl.subclass}` : "") }),
      el("div", { class: "strip" }, ...cl.nearest.map((id) => hitButton(coll, { id }, (i) => {
        openTab("search"); $("search-collection").value = coll; search({ image_id: i });
      }))))));
    status("clusters ready");
  } catch (e) { $("cluster-status").textContent = ""; status(e.message, true); }
}
$("cluster-form").addEventListener("submit", (e) => { e.preventDefault(); cluster(); });
$("cluster-collection").addEventListener("change", clusterSetup);
$("cluster-attribute").addEventListener("change", cluster);

// -- Explain -------------------------------------------------------------------------------------
function explainPick(id) {
  $("explain-id").value = id;
  $("explain-file").value = "";  // a picked image replaces an uploaded one
  const ex = INFO.explain.examples.find((x) => x.id === id);
  if (ex && ex.caption) $("explain-positive").value = ex.caption;
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
  } catch (e) { status(e.message, true); }
}
$("explain-form").addEventListener("submit", (e) => { e.preventDefault(); explain(); });

// -- Reports -------------------------------------------------------------------------------------
function reportsSetup() {
  const list = $("report-list");
  if (!INFO.reports.length) { list.replaceChildren(el("p", { class: "hint", text: "no reports (vlctl reproduce writes them)" })); return; }
  list.replaceChildren(...INFO.reports.map((r) => el("button", { type: "button", "data-report": r.id, text: r.title,
    onclick: () => { $("report-frame").src = r.url; } })));
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
  steerSetup();
  clusterSetup();
  if (INFO.explain) {
    $("explain-picks").replaceChildren(...INFO.explain.examples.map((x) =>
      hitButton("explain", { id: x.id, label: x.caption }, explainPick)));
    if (INFO.explain.examples.length) explainPick(INFO.explain.examples[0].id);
  } else {
    $("explain-results").replaceChildren(el("p", { class: "hint", text: "nothing to explain: the encoder has no ViT image tower" }));
  }
  reportsSetup();
  const want = location.hash.slice(1);
  openTab(TABS.includes(want) ? want : "search");
  status("ready");
})();
