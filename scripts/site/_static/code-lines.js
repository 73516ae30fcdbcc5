// Code that wraps keeps its indentation. A long line of a code cell (or of a printed table) wraps
// rather than scrolling sideways, and its continuation starts 4 characters to the right of the
// line's own indentation (a hanging indent), not at column 0 -- so the indentation that carries a
// Python program's structure stays readable at any width, and in print.
//
// Each line of a <pre> becomes a <span class="code-line" style="--indent: Nch">, N its leading
// spaces; site.css makes it a full-width inline-block with padding-left: N + 4 ch and text-indent:
// -(N + 4) ch. Pygments' highlighting spans are flat, so a line is cut out of them by splitting their
// text at newlines. The newlines stay as text between the lines (an inline-block adds none of its
// own), so the block's text -- what a copy gives -- is the code as written.
(function () {
  function splitLines(pre) {
    var lines = [[]];
    Array.prototype.slice.call(pre.childNodes).forEach(function (node) {
      node.textContent.split("\n").forEach(function (part, i) {
        if (i > 0) lines.push([]);
        if (!part) return;
        var piece = node.nodeType === Node.TEXT_NODE ? document.createTextNode(part) : node.cloneNode(false);
        if (node.nodeType !== Node.TEXT_NODE) piece.textContent = part;
        lines[lines.length - 1].push(piece);
      });
    });
    if (!lines[lines.length - 1].length) lines.pop(); // the text's last newline ends the last line
    pre.textContent = "";
    lines.forEach(function (nodes, k) {
      var line = document.createElement("span");
      line.className = "code-line";
      nodes.forEach(function (n) { line.appendChild(n); });
      var indent = /^ */.exec(line.textContent)[0].length;
      line.style.setProperty("--indent", indent + "ch");
      if (k > 0) pre.appendChild(document.createTextNode("\n"));
      pre.appendChild(line);
    });
  }

  function run() {
    document.querySelectorAll("article pre").forEach(function (pre) {
      if (!pre.querySelector(".code-line")) splitLines(pre);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
