// /docs: the API listed from /openapi.json with local code only (FastAPI's Swagger UI needs a CDN).
"use strict";

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// A schema as one short line: {"$ref": "#/components/schemas/Hit"} -> "Hit", arrays as "Hit[]".
function typeOf(s) {
  if (!s) return "";
  if (s.$ref) return s.$ref.split("/").pop();
  if (s.anyOf) return s.anyOf.map(typeOf).join(" | ");
  if (s.type === "array") return `${typeOf(s.items)}[]`;
  return s.type || "object";
}

function fields(schema, all) {
  const s = schema && schema.$ref ? all[schema.$ref.split("/").pop()] : schema;
  if (!s || !s.properties) return null;
  const req = new Set(s.required || []);
  return el("table", { class: "tree" }, el("tbody", {}, ...Object.entries(s.properties).map(([name, p]) =>
    el("tr", {}, el("td", {}, el("code", { text: name + (req.has(name) ? "" : "?") })), el("td", { text: typeOf(p) }),
      el("td", { text: p.description || "" })))));
}

(async function start() {
  try {
    const api = await (await fetch("/openapi.json")).json();
    const all = (api.components || {}).schemas || {};
    document.getElementById("title").textContent = `${api.info.title} ${api.info.version}: API`;
    const out = [el("p", { text: api.info.description || "" })];
    for (const [path, ops] of Object.entries(api.paths)) {
      for (const [method, op] of Object.entries(ops)) {
        const content = (op.requestBody || {}).content || {};
        const form = !content["application/json"] && content["multipart/form-data"];
        const body = (content["application/json"] || content["multipart/form-data"] || {}).schema;
        const params = (op.parameters || []).map((p) => `${p.name} (${p.in}${p.required ? "" : ", optional"})`);
        const ok = Object.entries(op.responses || {}).find(([code]) => code.startsWith("2"));
        const answer = ok && (((ok[1].content || {})["application/json"] || {}).schema);
        out.push(el("section", { class: "endpoint" },
          el("h2", {}, el("code", { text: `${method.toUpperCase()} ${path}` }), " ", el("span", { class: "hint", text: op.summary || "" })),
          op.description ? el("p", { text: op.description }) : null,
          params.length ? el("p", { text: `parameters: ${params.join(", ")}` }) : null,
          body ? el("p", { text: `request body${form ? " (a multipart form)" : ""}: ${typeOf(body)}` }) : null, body ? fields(body, all) : null,
          answer ? el("p", { text: `answer (${ok[0]}): ${typeOf(answer)}` }) : null));
      }
    }
    document.getElementById("endpoints").replaceChildren(...out);
  } catch (e) {
    document.getElementById("docs-status").textContent = `could not read /openapi.json: ${e.message}`;
  }
})();
