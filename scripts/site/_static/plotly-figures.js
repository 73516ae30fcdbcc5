// Draw every plotly figure of the page with the plotly.js bundled in this site (no CDN).
// scripts/build_site.py writes each figure as <div class="plotly-figure"> holding its JSON spec.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("div.plotly-figure").forEach(function (holder) {
    var spec = JSON.parse(holder.querySelector("script[type='application/json']").textContent);
    var target = document.createElement("div");
    holder.appendChild(target);
    var config = Object.assign({responsive: true, displaylogo: false}, spec.config || {});
    Plotly.newPlot(target, spec.data || [], spec.layout || {}, config);
  });
});
