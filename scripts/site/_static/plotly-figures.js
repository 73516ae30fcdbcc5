// Draw every plotly figure of the page with the plotly.js bundled in this site (no CDN).
// scripts/build_site.py writes each figure as <div class="plotly-figure"> holding its JSON spec.
//
// On the page a figure fits its column: the fixed width a lesson gives a figure for JupyterLab is
// dropped and the figure follows the column (plotly's autosize + responsive), at any window size.
// Hover labels of non-integer values get 4 significant digits (",.4~r": 24.36227 -> 24.36) where
// the figure set no format of its own; integer axes (token counts, block ids) stay exact.
(function () {
  var HOVER_FORMAT = ",.4~r";

  // Whether a trace's values along one coordinate are all integers (plain arrays, nested arrays, or
  // the typed-array form plotly.py writes: {dtype: "f8" | "i4" | ..., bdata: ...}).
  function allIntegers(values) {
    if (values == null) return true;
    if (values.dtype) return /^[iu]/.test(values.dtype);
    if (!Array.isArray(values)) return typeof values !== "number" || Number.isInteger(values);
    return values.every(allIntegers);
  }

  function formatHovers(data, layout) {
    var floatAxes = {};
    data.forEach(function (trace) {
      ["x", "y"].forEach(function (c) {
        var axis = c + "axis" + (trace[c + "axis"] || c).slice(1);
        if (!allIntegers(trace[c])) floatAxes[axis] = true;
      });
      if (trace.z != null && trace.zhoverformat == null && !allIntegers(trace.z)) trace.zhoverformat = HOVER_FORMAT;
    });
    Object.keys(floatAxes).forEach(function (axis) {
      layout[axis] = layout[axis] || {};
      if (layout[axis].hoverformat == null) layout[axis].hoverformat = HOVER_FORMAT;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("div.plotly-figure").forEach(function (holder) {
      var spec = JSON.parse(holder.querySelector("script[type='application/json']").textContent);
      var target = document.createElement("div");
      holder.appendChild(target);
      var data = spec.data || [], layout = spec.layout || {};
      delete layout.width;
      layout.autosize = true;
      formatHovers(data, layout);
      var config = Object.assign({displaylogo: false}, spec.config || {}, {responsive: true});
      Plotly.newPlot(target, data, layout, config);
    });
  });
})();
