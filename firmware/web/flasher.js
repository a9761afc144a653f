// The flash page: says what will be written, read from the two manifests that
// mpllm.board.release generated next to this page (the offsets come from the
// board's partitions.csv); esp-web-tools does the writing.

const release = document.getElementById("release");
const rows = document.querySelector("#parts tbody");

if (!("serial" in navigator)) document.getElementById("no-serial").hidden = false;

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
}

async function json(name) {
  const r = await fetch(name);
  if (!r.ok) throw new Error(`${name}: HTTP ${r.status}`);
  return r.json();
}

async function show() {
  let web, files;
  try {
    [web, files] = await Promise.all([json("manifest.json"), json("release-manifest.json")]);
  } catch (e) {
    release.textContent = `This page has no release next to it (${e.message}). ` +
      "It is assembled by `python -m mpllm.board.release site`.";
    release.className = "warning";
    return;
  }
  release.textContent = `mpllm ${files.version}: MicroPython ${files.micropython} ` +
    `(ESP-IDF ${files.esp_idf}), board ${files.board}.`;
  const byName = new Map(files.files.map((f) => [f.name, f]));
  for (const part of web.builds[0].parts) {
    const f = byName.get(part.path);
    const row = rows.insertRow();
    cell(row, part.path);
    cell(row, "0x" + part.offset.toString(16));
    cell(row, f ? f.size.toLocaleString("en") : "?");
    cell(row, f ? f.sha256 : "?", "hash");
  }
}

show();
