// gymtrace timeline: every episode of a run as a bar on a canvas, from the compact data the page
// carries (gymtrace/_read/pictures/timeline.py writes it). No network, no library.
//
// Each element with class "gymtrace-timeline" names its data in data-source (a <script
// type="application/json"> element). Bars are drawn per colour in one pass each, so a run of
// 100,000 rollouts draws in a few hundred thousand fillRect calls; where the lanes outnumber the
// pixel rows, neighbouring lanes share a row (said under the picture) until zoomed apart.
// window.gymtraceTimelines holds each timeline's figures (what was drawn) for tests and curious users.
(function () {
  "use strict";
  var PART_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#c9c3bd"];
  var PLAIN = "#8d99a6"; // a bar without a split (sampled out, lost)
  var BAND = ["rgba(237, 201, 72, 0.16)", "rgba(237, 201, 72, 0.30)"];
  var F = { FAILED: 1, CANCELLED: 2, LOST: 4, RETRY: 8, SLOW: 16, NOSPLIT: 32, RESTORED: 64 };
  var AXIS = 24, STRIP = 16, GUTTER = 190, MAX_AREA = 640, LANE_PX = 18;

  function fmtSeconds(us) {
    var s = us / 1e6;
    if (Math.abs(s) >= 100) return s.toFixed(0) + " s";
    if (Math.abs(s) >= 1) return s.toFixed(2) + " s";
    return (s * 1000).toFixed(s * 1000 >= 10 ? 1 : 2) + " ms";
  }

  function niceStep(span, ticks) {
    var raw = span / ticks, mag = Math.pow(10, Math.floor(Math.log10(raw))), n = raw / mag;
    return (n < 1.5 ? 1 : n < 3.5 ? 2 : n < 7.5 ? 5 : 10) * mag;
  }

  function Timeline(root, data) {
    this.root = root;
    this.data = data;
    var bars = data.bars;
    this.n = bars.lane.length;
    this.nLanes = Math.max(1, data.lanes.length);
    this.span = Math.max(1, data.span_us);
    this.canvas = root.querySelector("canvas");
    this.tip = root.querySelector(".tip");
    this.status = root.querySelector(".status");
    this.ctx = this.canvas.getContext("2d", { alpha: false });
    // Bars by lane, then start: the hover's binary search.
    var order = new Int32Array(this.n);
    for (var i = 0; i < this.n; i++) order[i] = i;
    var lane = bars.lane, start = bars.start;
    order.sort(function (a, b) { return lane[a] - lane[b] || start[a] - start[b]; });
    this.order = order;
    this.laneFirst = new Int32Array(this.nLanes + 1).fill(-1);
    for (var k = this.n - 1; k >= 0; k--) this.laneFirst[lane[order[k]]] = k;
    this.laneFirst[this.nLanes] = this.n;
    for (var l = this.nLanes - 1; l >= 0; l--) if (this.laneFirst[l] < 0) this.laneFirst[l] = this.laneFirst[l + 1];
    this.figures = { bars: this.n, lanes: data.lanes.length, bands: data.bands.length, drawn: 0, outlined: 0,
      failed: 0, lost: 0, retries: 0, plain: 0, lanesPerRow: 1, partPixels: null, draws: 0 };
    this.reset();
    this.bind();
  }

  Timeline.prototype.reset = function () {
    this.t0 = 0;
    this.t1 = this.span;
    this.firstLane = 0;
    this.laneCount = this.nLanes;
    this.draw();
  };

  Timeline.prototype.layout = function () {
    var width = Math.max(320, this.root.clientWidth);
    var area = Math.min(MAX_AREA, this.nLanes * LANE_PX);
    var dpr = window.devicePixelRatio || 1;
    // Train steps get a strip of their own under the axis (and their edges are drawn over the bars).
    this.top = AXIS + (this.data.bands.length ? STRIP : 0);
    this.width = width;
    this.height = this.top + area;
    this.area = area;
    if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(this.height * dpr)) {
      this.canvas.width = Math.round(width * dpr);
      this.canvas.height = Math.round(this.height * dpr);
      this.canvas.style.width = width + "px";
      this.canvas.style.height = this.height + "px";
    }
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.laneH = area / this.laneCount;
    this.gutter = this.laneH >= 10 ? GUTTER : 0;
    this.scale = (width - this.gutter - 8) / (this.t1 - this.t0);
  };

  Timeline.prototype.x = function (us) { return this.gutter + (us - this.t0) * this.scale; };

  Timeline.prototype.draw = function () {
    this.layout();
    var ctx = this.ctx, d = this.data, bars = d.bars, W = this.width, H = this.height;
    var laneH = this.laneH, first = this.firstLane, last = first + this.laneCount;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, W, H);
    // Train steps: bands behind the bars, in a strip of their own with their labels.
    ctx.font = "11px sans-serif";
    var edges = [];
    for (var b = 0; b < d.bands.length; b++) {
      var band = d.bands[b], bx0 = Math.max(this.gutter, this.x(band[0])), bx1 = Math.min(W, this.x(band[1]));
      if (bx1 <= bx0) continue;
      var bw = Math.max(1, bx1 - bx0);
      ctx.fillStyle = BAND[b % 2];
      ctx.fillRect(bx0, AXIS, bw, H - AXIS);
      ctx.fillStyle = "#edc948";
      ctx.fillRect(bx0, AXIS + 2, bw, STRIP - 4);
      edges.push(bx0, bx1);
      if (bw > 40) { ctx.fillStyle = "#4d3f00"; ctx.fillText(band[2], bx0 + 3, AXIS + STRIP - 4); }
    }
    // Bars, one colour at a time.
    var rects = [[], [], [], [], [], []]; // the five parts, then plain
    var outline = [], failed = [], lost = [], ticks = [];
    var gap = laneH >= 4 ? 1 : 0, h = Math.max(1, laneH - gap), marks = h >= 3;
    var drawn = 0, lanesRow = laneH < 1 ? Math.ceil(1 / laneH) : 1, dense = laneH < 1;
    // Where lanes share pixel rows, each pixel adds up the time of the parts of its lanes' bars.
    var cols = Math.ceil(W), acc = dense ? new Float32Array(Math.ceil(this.area) * cols * 6) : null;
    var lane = bars.lane, start = bars.start, dur = bars.dur, flags = bars.flags, split = bars.split;
    var x0min = this.gutter, t0 = this.t0, scale = this.scale, top = this.top;
    for (var i = 0; i < this.n; i++) {
      var ln = lane[i];
      if (ln < first || ln >= last) continue;
      var x0 = x0min + (start[i] - t0) * scale, w = dur[i] * scale;
      if (x0 + w < x0min || x0 > W) continue;
      if (x0 < x0min) { w -= x0min - x0; x0 = x0min; }
      if (w < 1) w = 1;
      var y = top + (ln - first) * laneH, f = flags[i];
      if (laneH < 1) y = top + Math.floor((ln - first) * laneH);
      drawn++;
      if (dense) {
        this.accumulate(acc, cols, Math.floor((ln - first) * laneH), x0, w, f & F.NOSPLIT ? null : split, i, dur[i]);
      } else if (f & F.NOSPLIT) {
        rects[5].push(x0, y, w, h);
      } else {
        var m = split[4 * i], t = split[4 * i + 1], e = split[4 * i + 2], v = split[4 * i + 3];
        var parts = [m, t, e, v, Math.max(0, dur[i] - m - t - e - v)];
        if (w < 3) {
          var best = 4;
          for (var p = 0; p < 4; p++) if (parts[p] > parts[best]) best = p;
          rects[best].push(x0, y, w, h);
        } else {
          var whole = Math.max(1, dur[i]), at = x0;
          for (var q = 0; q < 5; q++) {
            var pw = w * parts[q] / whole;
            if (pw > 0) rects[q].push(at, y, pw, h);
            at += pw;
          }
        }
      }
      if (f & F.SLOW) outline.push(x0, y, w, h);
      if (f & F.LOST) lost.push(x0, y, w, h);
      if (dense) continue; // failures and retries are marked once the lanes are zoomed apart
      if (f & (F.FAILED | F.CANCELLED)) failed.push(x0, y, w, h);
      if (f & F.RETRY) ticks.push(x0, y, h);
    }
    var colors = PART_COLORS.concat([PLAIN]);
    if (dense) this.paintDense(acc, cols, lanesRow, colors);
    for (var c = 0; c < 6; c++) {
      var r = rects[c];
      ctx.fillStyle = colors[c];
      for (var j = 0; j < r.length; j += 4) ctx.fillRect(r[j], r[j + 1], r[j + 2], r[j + 3]);
    }
    // Marks: a failed or cancelled attempt has a red edge below, a lost one a dashed red frame, a
    // retry a dark tick where it starts, the slowest 1 % of rollouts a black frame.
    ctx.fillStyle = "#d62728";
    for (var a = 0; a < failed.length; a += 4) {
      var fh = marks ? Math.max(2, failed[a + 3] / 4) : failed[a + 3];
      ctx.fillRect(failed[a], failed[a + 1] + failed[a + 3] - fh, failed[a + 2], fh);
    }
    ctx.strokeStyle = "#d62728";
    ctx.setLineDash([3, 2]);
    for (var z = 0; z < lost.length; z += 4) ctx.strokeRect(lost[z] + 0.5, lost[z + 1] + 0.5, Math.max(1, lost[z + 2] - 1), Math.max(1, lost[z + 3] - 1));
    ctx.setLineDash([]);
    if (marks) {
      ctx.fillStyle = "#222222";
      for (var k = 0; k < ticks.length; k += 3) ctx.fillRect(ticks[k], ticks[k + 1], 2, ticks[k + 2]);
    }
    ctx.strokeStyle = "#000000";
    ctx.lineWidth = 1.5;
    for (var o = 0; o < outline.length; o += 4) ctx.strokeRect(outline[o], outline[o + 1], Math.max(2, outline[o + 2]), Math.max(2, outline[o + 3]));
    ctx.lineWidth = 1;
    ctx.fillStyle = "rgba(122, 101, 20, 0.55)";
    for (var g = 0; g < edges.length; g++) ctx.fillRect(edges[g], this.top, 1, this.area);
    this.drawAxis();
    this.drawLabels();
    var fig = this.figures;
    fig.drawn = drawn;
    fig.outlined = outline.length / 4;
    fig.failed = failed.length / 4;
    fig.lost = lost.length / 4;
    fig.retries = ticks.length / 3;
    fig.plain = rects[5].length / 4;
    fig.lanesPerRow = lanesRow;
    fig.draws++;
    var shown = "lanes " + (first + 1) + "–" + Math.min(last, this.nLanes) + " of " + this.nLanes;
    this.status.textContent = drawn + " of " + this.n + " bars drawn, " + shown +
      (lanesRow > 1 ? "; " + lanesRow + " lanes share each pixel row (shift + wheel to zoom the lanes apart)" : "") +
      ". Wheel: zoom time · shift + wheel: zoom lanes · drag: pan · double-click: all.";
  };

  // Add bar i's parts (or, without a split, its whole width as "plain") to the pixels of its row.
  Timeline.prototype.accumulate = function (acc, cols, row, x0, w, split, i, dur) {
    var base = row * cols * 6, at = x0;
    for (var q = 0; q < 6; q++) {
      var pw;
      if (split === null) {
        if (q < 5) continue;
        pw = w;
      } else if (q < 4) {
        pw = w * split[4 * i + q] / Math.max(1, dur);
      } else if (q === 4) {
        pw = w * Math.max(0, dur - split[4 * i] - split[4 * i + 1] - split[4 * i + 2] - split[4 * i + 3]) / Math.max(1, dur);
      } else {
        continue;
      }
      var end = Math.min(at + pw, cols);
      for (var col = Math.floor(at); col < end; col++) {
        var cover = Math.min(end, col + 1) - Math.max(at, col);
        if (cover > 0) acc[base + col * 6 + q] += cover;
      }
      at += pw;
    }
  };

  // Each pixel the colour of the part that held most of its lanes' time there, paler the fewer of
  // its lanes were busy.
  Timeline.prototype.paintDense = function (acc, cols, lanesRow, colors) {
    var rows = Math.ceil(this.area), image = this.ctx.createImageData(cols, rows), px = image.data;
    var rgb = colors.map(function (hex) {
      return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)];
    });
    for (var k = 0, n = rows * cols; k < n; k++) {
      var total = 0, best = 0, most = -1;
      for (var q = 0; q < 6; q++) {
        var v = acc[k * 6 + q];
        total += v;
        if (v > most) { most = v; best = q; }
      }
      var o = k * 4;
      if (total <= 0) continue; // transparent: the train steps behind show
      var busy = Math.min(1, total / lanesRow), keep = 0.3 + 0.7 * busy;
      px[o] = Math.round(255 - (255 - rgb[best][0]) * keep);
      px[o + 1] = Math.round(255 - (255 - rgb[best][1]) * keep);
      px[o + 2] = Math.round(255 - (255 - rgb[best][2]) * keep);
      px[o + 3] = 255;
    }
    var off = document.createElement("canvas");
    off.width = cols;
    off.height = rows;
    off.getContext("2d").putImageData(image, 0, 0);
    this.ctx.drawImage(off, 0, this.top);
  };

  Timeline.prototype.drawAxis = function () {
    var ctx = this.ctx, W = this.width;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, W, AXIS);
    ctx.strokeStyle = "#999999";
    ctx.beginPath();
    ctx.moveTo(this.gutter, AXIS - 0.5);
    ctx.lineTo(W, AXIS - 0.5);
    ctx.stroke();
    var step = niceStep(this.t1 - this.t0, Math.max(2, Math.floor((W - this.gutter) / 110)));
    ctx.fillStyle = "#333333";
    ctx.font = "11px sans-serif";
    for (var t = Math.ceil(this.t0 / step) * step; t <= this.t1; t += step) {
      var x = this.x(t);
      ctx.fillRect(x, AXIS - 5, 1, 5);
      ctx.fillText(fmtSeconds(t), x + 2, AXIS - 8);
    }
  };

  Timeline.prototype.drawLabels = function () {
    if (!this.gutter) return;
    var ctx = this.ctx;
    ctx.fillStyle = "#f6f6f6";
    ctx.fillRect(0, this.top, this.gutter - 4, this.area);
    ctx.fillStyle = "#333333";
    ctx.font = "11px sans-serif";
    for (var l = this.firstLane; l < Math.min(this.nLanes, this.firstLane + this.laneCount); l++) {
      var text = this.data.lanes[l] || "";
      if (text.length > 30) text = text.slice(0, 14) + "…" + text.slice(-15);
      ctx.fillText(text, 4, this.top + (l - this.firstLane) * this.laneH + Math.min(this.laneH, 14) - 3);
    }
  };

  // The bar under (x, y) in CSS pixels of the canvas, or -1.
  Timeline.prototype.barAt = function (x, y) {
    if (y < this.top || x < this.gutter) return -1;
    var row = y - this.top, from = this.firstLane + Math.floor(row / this.laneH);
    var to = this.laneH < 1 ? this.firstLane + Math.floor((Math.floor(row) + 1) / this.laneH) : from + 1;
    var t = this.t0 + (x - this.gutter) / this.scale, slack = 1.5 / this.scale;
    var bars = this.data.bars, order = this.order;
    for (var ln = Math.max(0, from); ln < Math.min(to, this.nLanes); ln++) {
      var lo = this.laneFirst[ln], hi = this.laneFirst[ln + 1] - 1, found = -1;
      while (lo <= hi) {
        var mid = (lo + hi) >> 1;
        if (bars.start[order[mid]] <= t + slack) { found = mid; lo = mid + 1; } else hi = mid - 1;
      }
      for (var k = found; k >= this.laneFirst[ln] && k > found - 4; k--) {
        var i = order[k];
        if (bars.start[i] + bars.dur[i] + slack >= t) return i;
      }
    }
    return -1;
  };

  // Where bar i is drawn (CSS pixels of the canvas), for tests that point at it.
  Timeline.prototype.barBox = function (i) {
    var bars = this.data.bars, x0 = this.x(bars.start[i]), w = Math.max(1, bars.dur[i] * this.scale);
    return { x: x0, y: this.top + (bars.lane[i] - this.firstLane) * this.laneH, w: w, h: Math.max(1, this.laneH) };
  };

  Timeline.prototype.describe = function (i) {
    var d = this.data, bars = d.bars, ro = d.rollouts, r = bars.rollout[i], f = bars.flags[i];
    var reward = ro.reward[r];
    var lines = [
      ["rollout", ro.id[r]],
      ["task", d.tasks[ro.task[r]]],
      ["attempt", bars.attempt[i] + (f & F.RESTORED ? " (restored)" : "") + " of " + ro.attempts[r]],
      ["episode", d.outcomes[bars.outcome[i]] || ""],
      ["rollout outcome", d.outcomes[ro.outcome[r]] + (ro.failure[r] ? " (" + ro.failure[r] + ")" : "")],
      ["reward", reward === null ? "none (unscored)" : String(reward)],
      ["duration", fmtSeconds(bars.dur[i]) + (f & F.SLOW ? " (rollout among the slowest 1 %)" : "")],
    ];
    if (!(f & F.NOSPLIT)) {
      var parts = [], dur = Math.max(1, bars.dur[i]), sum = 0;
      for (var p = 0; p < 4; p++) {
        var v = bars.split[4 * i + p];
        sum += v;
        parts.push(d.parts[p] + " " + fmtSeconds(v));
      }
      parts.push(d.parts[4] + " " + fmtSeconds(Math.max(0, bars.dur[i] - sum)));
      lines.push(["split", parts.join(", ")]);
    } else {
      lines.push(["split", "none (no detail)"]);
    }
    lines.push(["lane", d.lanes[bars.lane[i]]]);
    lines.push(["trace ID", ro.trace[r]]);
    return lines;
  };

  // The train step under (x, y) in the strip of train steps, or -1.
  Timeline.prototype.bandAt = function (x, y) {
    if (y < AXIS || y >= this.top || x < this.gutter) return -1;
    var t = this.t0 + (x - this.gutter) / this.scale, slack = 1.5 / this.scale;
    for (var b = 0; b < this.data.bands.length; b++) {
      var band = this.data.bands[b];
      if (band[0] - slack <= t && t <= band[1] + slack) return b;
    }
    return -1;
  };

  Timeline.prototype.hover = function (x, y) {
    var i = this.barAt(x, y), lines;
    var band = i < 0 ? this.bandAt(x, y) : -1;
    if (i >= 0) {
      lines = this.describe(i);
    } else if (band >= 0) {
      var found = this.data.bands[band];
      lines = [["train step", found[2]], ["from", fmtSeconds(found[0])], ["for", fmtSeconds(found[1] - found[0])]];
    } else {
      this.tip.hidden = true;
      this.hovered = -1;
      return null;
    }
    this.hovered = i;
    var tip = this.tip;
    tip.textContent = "";
    for (var k = 0; k < lines.length; k++) {
      var row = document.createElement("div");
      var key = document.createElement("b");
      key.textContent = lines[k][0] + ": ";
      row.appendChild(key);
      row.appendChild(document.createTextNode(lines[k][1]));
      tip.appendChild(row);
    }
    tip.hidden = false;
    tip.style.left = Math.min(x + 14, this.width - 340) + "px";
    tip.style.top = (y + 14) + "px";
    return tip.innerText;
  };

  Timeline.prototype.bind = function () {
    var self = this, canvas = this.canvas, drag = null;
    function pos(ev) { var r = canvas.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
    canvas.addEventListener("mousemove", function (ev) {
      var p = pos(ev);
      if (drag) {
        var dt = (p[0] - drag.x) / self.scale, dl = (p[1] - drag.y) / self.laneH;
        self.t0 = drag.t0 - dt; self.t1 = drag.t1 - dt;
        self.firstLane = Math.max(0, Math.min(self.nLanes - self.laneCount, Math.round(drag.lane - dl)));
        self.draw();
        return;
      }
      self.hover(p[0], p[1]);
    });
    canvas.addEventListener("mouseleave", function () { self.tip.hidden = true; drag = null; });
    canvas.addEventListener("mousedown", function (ev) {
      var p = pos(ev);
      drag = { x: p[0], y: p[1], t0: self.t0, t1: self.t1, lane: self.firstLane };
    });
    window.addEventListener("mouseup", function () { drag = null; });
    canvas.addEventListener("dblclick", function () { self.reset(); });
    canvas.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var p = pos(ev), factor = ev.deltaY > 0 ? 1.25 : 0.8;
      if (ev.shiftKey) {
        var at = self.firstLane + Math.max(0, p[1] - self.top) / self.laneH;
        var count = Math.max(1, Math.min(self.nLanes, Math.round(self.laneCount * factor)));
        self.firstLane = Math.max(0, Math.min(self.nLanes - count, Math.round(at - (at - self.firstLane) * count / self.laneCount)));
        self.laneCount = count;
      } else {
        var t = self.t0 + (Math.max(self.gutter, p[0]) - self.gutter) / self.scale;
        var width = Math.max(1, (self.t1 - self.t0) * factor);
        self.t0 = t - (t - self.t0) * width / (self.t1 - self.t0);
        self.t1 = self.t0 + width;
      }
      self.draw();
    }, { passive: false });
    window.addEventListener("resize", function () { self.draw(); });
  };

  // How many pixels of each part's colour the canvas holds (tests: what was drawn, not only what was meant).
  Timeline.prototype.countPartPixels = function () {
    var image = this.ctx.getImageData(0, 0, this.canvas.width, this.canvas.height).data;
    var rgb = PART_COLORS.concat([PLAIN]).map(function (hex) {
      return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16), parseInt(hex.slice(5, 7), 16)];
    });
    var counts = [0, 0, 0, 0, 0, 0];
    for (var i = 0; i < image.length; i += 4) {
      for (var c = 0; c < rgb.length; c++) {
        if (image[i] === rgb[c][0] && image[i + 1] === rgb[c][1] && image[i + 2] === rgb[c][2]) { counts[c]++; break; }
      }
    }
    return counts;
  };

  window.gymtraceTimelines = window.gymtraceTimelines || [];
  var roots = document.querySelectorAll(".gymtrace-timeline");
  for (var n = 0; n < roots.length; n++) {
    var source = document.getElementById(roots[n].getAttribute("data-source"));
    window.gymtraceTimelines.push(new Timeline(roots[n], JSON.parse(source.textContent)));
  }
})();
