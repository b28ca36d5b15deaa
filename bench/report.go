package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteMarkdown writes a summary table with one row per run, then the answers of every run.
func WriteMarkdown(w io.Writer, title string, runs ...Result) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## %s\n\n", title)
	b.WriteString("| # | path | mode | clients | rate/s | merchants | s | requests | req/s | new payments/s | p50 ms | p90 ms | p95 ms | p99 ms | max ms | errors | unsent | machine speed |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	speeds := machineSpeeds(runs)
	for i, r := range runs {
		rate := "-"
		if r.Rate > 0 {
			rate = strconv.FormatFloat(math.Round(r.Rate*10)/10, 'f', -1, 64) // the suite's half rate is a quotient
		}
		speed := "-"
		if speeds[i] > 0 {
			speed = fmt.Sprintf("%.0f%%", 100*speeds[i])
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %s | %d | %.1f | %d | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %d | %s |\n",
			i+1, cell(r.Path), r.Mode, r.Concurrency, rate, r.Merchants, r.Duration, r.Requests, r.Throughput,
			r.NewPaymentRate, r.Latency.P50, r.Latency.P90, r.Latency.P95, r.Latency.P99, r.Latency.Max, r.Errors, r.Unsent, speed)
	}
	b.WriteString("\n| # | answer | count | share |\n|---|---|---:|---:|\n")
	for i, r := range runs {
		for _, k := range slices.Sorted(maps.Keys(r.Answers)) {
			fmt.Fprintf(&b, "| %d | %s | %d | %.1f%% |\n", i+1, cell(k), r.Answers[k], 100*float64(r.Answers[k])/float64(max(r.Requests, 1)))
		}
		if r.Errors > 0 {
			fmt.Fprintf(&b, "| %d | transport error: %s | %d | |\n", i+1, cell(r.FirstError), r.Errors)
		}
	}
	writeCPU(&b, runs)
	_, err := w.Write(b.Bytes())
	return err
}

// writeCPU writes what an operation of each run cost in CPU, by process class, if any run measured it.
func writeCPU(b *bytes.Buffer, runs []Result) {
	if !slices.ContainsFunc(runs, func(r Result) bool { return r.CPU != nil }) {
		return
	}
	b.WriteString("\nCPU per operation, in milliseconds, over each run's measured window (kasa: the measured `kasa dev`; bench: the load generator, and T's worker in T runs):\n\n")
	b.WriteString("| # | per | kasa | postgres | temporal | bench | other | all | cores busy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range runs {
		if r.CPU == nil {
			continue
		}
		var other, all float64
		for class, ms := range r.CPU.MS {
			all += ms
			if !slices.Contains([]string{ClassKasa, ClassPostgres, ClassTemporal, ClassBench}, class) {
				other += ms
			}
		}
		m := r.CPU.MS
		fmt.Fprintf(b, "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
			i+1, r.CPU.Per, m[ClassKasa], m[ClassPostgres], m[ClassTemporal], m[ClassBench], other, all, r.CPU.Cores)
	}
}

// machineSpeeds is each run's probe as a share of the fastest probe among runs (0: not probed).
func machineSpeeds(runs []Result) []float64 {
	var fastest float64
	for _, r := range runs {
		fastest = max(fastest, r.Probe)
	}
	out := make([]float64, len(runs))
	for i, r := range runs {
		if fastest > 0 {
			out[i] = r.Probe / fastest
		}
	}
	return out
}

// cell keeps a value from breaking its table row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// WriteSVG draws requests per second (left axis) and p99 latency (right axis) over the seconds of
// a run as a self-contained SVG line chart.
func WriteSVG(w io.Writer, title string, series []Second) error {
	const (
		width, height         = 800, 320
		left, right, top, bot = 60, 60, 40, 40
		plotW, plotH          = width - left - right, height - top - bot
	)
	var maxReq int64
	var maxP99 float64
	for _, s := range series {
		maxReq, maxP99 = max(maxReq, s.Requests), max(maxP99, s.P99)
	}
	yReq, yP99 := niceCeil(float64(maxReq)), niceCeil(maxP99)
	x := func(i int) float64 {
		if len(series) < 2 {
			return left + plotW/2
		}
		return left + float64(i)*plotW/float64(len(series)-1)
	}
	y := func(v, ceil float64) float64 { return top + plotH - v/ceil*plotH }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(title))
	for k := 0; k <= 4; k++ { // grid lines with both axes' labels
		gy := top + plotH - float64(k)*plotH/4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, gy, left+plotW, gy)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="#1f77b4">%s</text>`+"\n", left-6, gy+4, num(yReq*float64(k)/4))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#d62728">%s</text>`+"\n", left+plotW+6, gy+4, num(yP99*float64(k)/4))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">second</text>`+"\n", left+plotW/2, height-8)
	if n := len(series); n > 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%d</text>`+"\n", left, top+plotH+16, series[0].Second)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%d</text>`+"\n", left+plotW, top+plotH+16, series[n-1].Second)
	}
	line := func(color string, v func(Second) float64, ceil float64) {
		if len(series) == 0 {
			return
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, color)
		for i, s := range series {
			fmt.Fprintf(&b, "%.1f,%.1f ", x(i), y(v(s), ceil))
		}
		b.WriteString("\"/>\n")
	}
	line("#1f77b4", func(s Second) float64 { return float64(s.Requests) }, yReq)
	line("#d62728", func(s Second) float64 { return s.P99 }, yP99)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#1f77b4">requests/s</text>`+"\n", left+plotW-200, top-8)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#d62728">p99 ms</text>`+"\n", left+plotW-100, top-8)
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// niceCeil rounds an axis maximum up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	m := 1.0
	for m*10 <= v {
		m *= 10
	}
	for _, f := range []float64{1, 2, 5, 10} {
		if f*m >= v {
			return f * m
		}
	}
	return 10 * m
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
