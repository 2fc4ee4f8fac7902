// viz.js -- the VIZ page: the schedules and kernels (lists), a schedule's graph (SVG laid out by
// Graphviz when the page was made), a kernel's AST, opts, source and assembly, and the timeline of
// kernel runs per device with the memory in use. All data comes from data.js (window.TG_VIZ).
(function () {
  'use strict';
  var D = window.TG_VIZ;
  var SVG = 'http://www.w3.org/2000/svg';
  var COLORS = ['#fd7e14', '#40c057', '#228be6', '#e64980', '#7950f2', '#fab005', '#15aabf', '#fa5252',
                '#82c91e', '#be4bdb', '#868e96', '#12b886'];
  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function sel(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtTime(s) {
    if (s >= 1) return s.toFixed(3) + ' s';
    if (s >= 1e-3) return (s * 1e3).toFixed(3) + ' ms';
    return (s * 1e6).toFixed(2) + ' us';
  }
  function fmtBytes(b) {
    if (b >= 1e9) return (b / 1e9).toFixed(2) + ' GB';
    if (b >= 1e6) return (b / 1e6).toFixed(2) + ' MB';
    if (b >= 1e3) return (b / 1e3).toFixed(2) + ' KB';
    return b + ' B';
  }
  function rate(x, s) { return s > 0 ? x / s * 1e-9 : 0; }

  if (!D) {
    $('summary').textContent = 'data.js did not load';
    return;
  }
  var kernelTime = 0, kernelRuns = 0;
  D.runs.forEach(function (r) { if (r[0] >= 0) { kernelTime += r[6]; kernelRuns++; } });
  $('summary').textContent = D.schedules.length + ' schedules, ' + D.kernels.length + ' kernels, ' +
    D.runs_total + ' runs (' + fmtTime(kernelTime) + ' in kernels) -- ' + D.program.replace(/^.*\//, '');
  $('summary').title = D.program + ' (pid ' + D.pid + ')';
  if (D.schedules_dropped) $('summary').textContent += ' (' + D.schedules_dropped + ' later realizes were not recorded)';

  // ---- lists ------------------------------------------------------------------------------------
  var usedIn = D.kernels.map(function () { return []; });
  D.schedules.forEach(function (s, i) {
    s.items.forEach(function (k) { if (k >= 0 && usedIn[k].indexOf(i) < 0) usedIn[k].push(i); });
  });
  var schedLis = [], kernelLis = [];
  D.schedules.forEach(function (s, i) {
    var nk = s.items.filter(function (k) { return k !== -1; }).length, nc = s.items.length - nk;
    var li = el('li', 'sched');
    li.appendChild(el('span', '', 'realize ' + i));
    li.appendChild(el('span', 'meta', ' ' + nk + ' kernel' + (nk === 1 ? '' : 's') + (nc ? ', ' + nc + ' copies' : '')));
    li.onclick = function () { showSchedule(i); };
    $('schedules').appendChild(li);
    schedLis.push(li);
    var ul = el('ul');
    s.items.forEach(function (k, item) {
      var sub = el('li', 'sched-kernel', k >= 0 ? D.kernels[k].name : k === -1 ? 'copy' : '(not run)');
      sub.onclick = function (ev) { ev.stopPropagation(); showSchedule(i); if (k >= 0) showKernel(k, item); };
      ul.appendChild(sub);
    });
    $('schedules').appendChild(ul);
  });
  D.kernels.forEach(function (k, i) {
    var li = el('li', 'kernel');
    li.appendChild(el('span', 'kname', k.name));
    li.appendChild(el('span', 'meta', ' ' + k.device + ', ' + k.runs + ' run' + (k.runs === 1 ? '' : 's')));
    li.title = k.name + ' on ' + k.device;
    li.onclick = function () {
      if (usedIn[i].length && usedIn[i].indexOf(curSched) < 0) showSchedule(usedIn[i][usedIn[i].length - 1]);
      showKernel(i);
    };
    $('kernels').appendChild(li);
    kernelLis.push(li);
  });

  $('filter').addEventListener('input', function () {
    var f = this.value.toLowerCase();
    kernelLis.forEach(function (li, i) { li.hidden = f !== '' && D.kernels[i].name.toLowerCase().indexOf(f) < 0; });
  });

  // ---- graph ------------------------------------------------------------------------------------
  var curSched = -1, curKernel = -1;
  function showSchedule(i) {
    var s = D.schedules[i];
    curSched = i;
    schedLis.forEach(function (li, j) { li.classList.toggle('on', j === i); });
    $('graph-title').textContent = 'realize ' + i + ': ' + s.nodes + ' nodes, ' + s.items.length + ' items' +
      (s.truncated ? ' (graph cut at ' + s.nodes + ' nodes)' : '');
    // s.svg: the index of its layout in D.svgs (distinct graphs are stored once), or null
    var svgText = s.svg !== null && s.svg !== undefined ? D.svgs[s.svg] : null;
    var note = svgText ? '' : (D.dot_error || s.why || '');
    $('graph-note').textContent = note;
    var box = $('graph-svg');
    box.innerHTML = '';
    if (svgText) {
      box.innerHTML = svgText;
      var svg = box.querySelector('svg');
      if (svg) {
        // fitted to the pane (the viewBox scales it); a click on the background shows it at 1:1
        var natural = [svg.getAttribute('width'), svg.getAttribute('height')];
        var fit = function (on) {
          box.classList.toggle('fit', on);
          if (on) { svg.removeAttribute('width'); svg.removeAttribute('height'); }
          else { svg.setAttribute('width', natural[0]); svg.setAttribute('height', natural[1]); }
        };
        fit(true);
        svg.addEventListener('click', function (ev) {
          if (ev.target === svg || (ev.target.parentNode && ev.target.parentNode.classList.contains('graph'))) fit(!box.classList.contains('fit'));
        });
      }
      box.querySelectorAll('g.cluster').forEach(function (g) {
        var item = parseInt(g.id.replace(/^k/, ''), 10);
        g.onclick = function () { var k = s.items[item]; if (k >= 0) showKernel(k, item); };
      });
    } else if (s.dot) {
      box.appendChild(el('pre', 'pane', s.dot));
    }
  }

  // ---- kernel -----------------------------------------------------------------------------------
  function showKernel(i, item) {
    var k = D.kernels[i];
    kernelLis.forEach(function (li, j) { li.classList.toggle('on', j === i); });
    document.querySelectorAll('#graph-svg g.cluster').forEach(function (g) {
      var it = parseInt(g.id.replace(/^k/, ''), 10);
      var s = D.schedules[curSched];
      g.classList.toggle('on', !!s && s.items[it] === i && (item === undefined || item === it));
    });
    $('kernel-title').textContent = k.name;
    curKernel = i;
    document.querySelectorAll('#timeline rect.run').forEach(function (r) {
      r.classList.toggle('sel', D.runs[+r.getAttribute('data-run')][0] === i);
    });
    var avg = k.runs ? k.time / k.runs : 0;
    var rows = [['device', k.device], ['opts', k.opts || '(none)'], ['global size', k.global.join(' x ')],
                ['local size', k.local.join(' x ')], ['buffers', k.params], ['FLOPs per run', k.ops],
                ['runs', k.runs + (k.runs ? ', ' + fmtTime(k.time) + ' in all, ' + fmtTime(avg) + ' each' : '')],
                ['GFLOPS', rate(k.ops, avg).toFixed(2)],
                ['in realizes', usedIn[i].length ? usedIn[i].slice(0, 20).join(', ') + (usedIn[i].length > 20 ? ', ...' : '') :
                                 '(TinyJit replays only)']];
    var t = $('kernel-info');
    t.innerHTML = '';
    rows.forEach(function (r) {
      var tr = el('tr');
      tr.appendChild(el('td', '', r[0]));
      tr.appendChild(el('td', '', String(r[1])));
      t.appendChild(tr);
    });
    $('kernel-ast').textContent = k.ast || '(not recorded)';
    $('kernel-src').textContent = k.src;
    $('kernel-asm').textContent = k.asm || 'no assembly for this device (CPU kernels are disassembled with objdump)';
  }
  document.querySelectorAll('#kernel-tabs button').forEach(function (b) {
    b.onclick = function () {
      document.querySelectorAll('#kernel-tabs button').forEach(function (o) { o.classList.toggle('on', o === b); });
      document.querySelectorAll('pre.pane').forEach(function (p) {
        if (p.parentNode.id === 'kernel') p.hidden = p.id !== b.dataset.pane;
      });
    };
  });

  // ---- timeline and memory ----------------------------------------------------------------------
  var devs = [];
  D.runs.forEach(function (r) { if (devs.indexOf(r[3]) < 0) devs.push(r[3]); });
  D.mem.forEach(function (m) { if (devs.indexOf(m[1]) < 0) devs.push(m[1]); });
  devs.sort(function (a, b) { return a - b; });
  var tEnd = 0;
  D.runs.forEach(function (r) { tEnd = Math.max(tEnd, r[5] + r[6]); });
  D.mem.forEach(function (m) { tEnd = Math.max(tEnd, m[0]); });
  var tStart = D.runs.length ? D.runs[0][5] : 0;
  D.runs.forEach(function (r) { tStart = Math.min(tStart, r[5]); });
  D.mem.forEach(function (m) { tStart = Math.min(tStart, m[0]); });
  if (!(tEnd > tStart)) tEnd = tStart + 1e-3;
  var pad = (tEnd - tStart) * 0.02;
  tStart -= pad, tEnd += pad;
  var view = [tStart, tEnd];
  var LEFT = 70, LANE = 30;

  function width() { return Math.max(600, ($('bottom').clientWidth || 1200) - 24); }
  function xOf(t, W) { return LEFT + (t - view[0]) / (view[1] - view[0]) * (W - LEFT - 10); }

  function axis(svg, W, H) {
    var span = view[1] - view[0], step = Math.pow(10, Math.floor(Math.log10(span / 8)));
    if (span / step > 16) step *= 5; else if (span / step > 8) step *= 2;
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1]; t += step) {
      var x = xOf(t, W);
      sel('line', {'class': 'tick', x1: x, x2: x, y1: 0, y2: H}, svg);
      sel('text', {'class': 'tick', x: x + 2, y: H - 2}, svg).textContent = fmtTime(t);
    }
  }

  var hasCopies = {};
  D.runs.forEach(function (r) { if (r[0] === -1) hasCopies[r[3]] = true; });
  var laneY = {}, laneH = 0;
  devs.forEach(function (d) { laneY[d] = laneH; laneH += LANE * (hasCopies[d] ? 2 : 1); });

  function drawTimeline() {
    var W = width(), H = laneH + 16;
    var box = $('timeline');
    box.innerHTML = '';
    var svg = sel('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H});
    box.appendChild(svg);
    axis(svg, W, H);
    devs.forEach(function (d) {
      var y = laneY[d];
      sel('text', {'class': 'lane', x: 4, y: y + 18}, svg).textContent = D.devices[d] || ('device ' + d);
      if (hasCopies[d]) sel('text', {'class': 'lane', x: 4, y: y + LANE + 18}, svg).textContent = 'copies to it';
    });
    D.runs.forEach(function (r, i) {
      if (r[5] + r[6] < view[0] || r[5] > view[1]) return;
      var copy = r[0] === -1;
      var x = xOf(r[5], W), w = Math.max(1, xOf(r[5] + r[6], W) - x);
      var y = laneY[r[3]] + (copy ? LANE : 0) + 4;
      var rect = sel('rect', {'class': copy ? 'copy' : 'run', x: x.toFixed(2), y: y, width: w.toFixed(2), height: LANE - 8,
                              'data-run': i}, svg);
      if (!copy) rect.setAttribute('fill', COLORS[Math.max(r[0], 0) % COLORS.length]);
      if (!copy && r[0] === curKernel) rect.classList.add('sel');
      var name = copy ? 'copy ' + (D.devices[r[4]] || r[4]) + ' -> ' + (D.devices[r[3]] || r[3]) :
                 (r[0] >= 0 ? D.kernels[r[0]].name : 'kernel');
      sel('title', {}, rect).textContent = name + '\n' + fmtTime(r[6]) + ', ' + fmtBytes(r[8]) +
        (copy ? '' : ', ' + rate(r[7], r[6]).toFixed(2) + ' GFLOPS') + ', ' + rate(r[8], r[6]).toFixed(2) + ' GB/s' +
        (r[1] >= 0 ? '\nrealize ' + r[1] + ', item ' + r[2] : '\nTinyJit replay');
      if (!copy && r[0] >= 0) rect.onclick = function () { if (r[1] >= 0) showSchedule(r[1]); showKernel(r[0], r[2]); };
    });
    if (D.runs_total > D.runs.length) {
      sel('text', {'class': 'lane', x: LEFT, y: H - 14}, svg).textContent =
        'showing the first ' + D.runs.length + ' of ' + D.runs_total + ' runs';
    }
  }

  function drawMemory() {
    var W = width(), PER = 70, H = Math.max(1, devs.length) * PER + 14;
    var box = $('memory');
    box.innerHTML = '';
    var svg = sel('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H});
    box.appendChild(svg);
    axis(svg, W, H);
    devs.forEach(function (d, li) {
      var pts = D.mem.filter(function (m) { return m[1] === d; });
      var top = li * PER + 6, bot = top + PER - 12;
      var max = 1;
      pts.forEach(function (m) { max = Math.max(max, m[2]); });
      var color = COLORS[li % COLORS.length];
      var path = 'M' + LEFT + ',' + bot, last = 0;
      pts.forEach(function (m) {
        var x = Math.min(Math.max(xOf(m[0], W), LEFT), W - 10);
        var y = bot - m[2] / max * (bot - top);
        path += ' L' + x.toFixed(1) + ',' + (bot - last / max * (bot - top)).toFixed(1) + ' L' + x.toFixed(1) + ',' + y.toFixed(1);
        last = m[2];
      });
      path += ' L' + (W - 10) + ',' + (bot - last / max * (bot - top)).toFixed(1) + ' L' + (W - 10) + ',' + bot + ' Z';
      sel('path', {'class': 'mem', d: path, stroke: color, fill: color, 'data-device': D.devices[d] || d}, svg);
      sel('text', {'class': 'lane', x: 4, y: top + 12}, svg).textContent = D.devices[d] || ('device ' + d);
      sel('text', {'class': 'tick', x: 4, y: top + 26}, svg).textContent = 'max ' + fmtBytes(max);
    });
  }

  function redraw() { drawTimeline(); drawMemory(); }
  var drag = null;
  ['timeline', 'memory'].forEach(function (id) {
    var box = $(id);
    box.addEventListener('wheel', function (ev) {
      ev.preventDefault();
      var W = width(), rect = box.getBoundingClientRect();
      var f = Math.min(Math.max((ev.clientX - rect.left - LEFT) / (W - LEFT - 10), 0), 1);
      var t = view[0] + f * (view[1] - view[0]), z = ev.deltaY > 0 ? 1.25 : 0.8;
      var span = Math.max((view[1] - view[0]) * z, 1e-7);
      view = [t - f * span, t + (1 - f) * span];
      redraw();
    }, {passive: false});
    box.addEventListener('mousedown', function (ev) { drag = {x: ev.clientX, v: view.slice()}; });
    box.addEventListener('dblclick', function () { view = [tStart, tEnd]; redraw(); });
  });
  window.addEventListener('mousemove', function (ev) {
    if (!drag) return;
    var dt = (ev.clientX - drag.x) / (width() - LEFT - 10) * (drag.v[1] - drag.v[0]);
    view = [drag.v[0] - dt, drag.v[1] - dt];
    redraw();
  });
  window.addEventListener('mouseup', function () { drag = null; });
  window.addEventListener('resize', redraw);

  // ---- start: the last schedule with kernels, its first kernel ----------------------------------
  redraw();
  var first = -1;
  for (var i = D.schedules.length - 1; i >= 0 && first < 0; i--)
    if (D.schedules[i].items.some(function (k) { return k >= 0; })) first = i;
  var m = /#realize=(\d+)/.exec(location.hash);
  if (m && D.schedules[+m[1]]) first = +m[1];
  if (first >= 0) {
    showSchedule(first);
    var s = D.schedules[first];
    for (var j = 0; j < s.items.length; j++) if (s.items[j] >= 0) { showKernel(s.items[j], j); break; }
  } else if (D.kernels.length) {
    showKernel(0);
  }
})();
