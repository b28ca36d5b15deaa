package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// PaydayFactor is how many times T's rate the payday run offers.
const PaydayFactor = 10

// Payday is a burst above what the cluster runs (docs/operations.md, "Payday"): T of the
// payment's shape and P of the accept transaction measured first, then an open loop offering
// PaydayFactor × T for the window, then nothing until every accepted payment is final.
type Payday struct {
	Header
	T      Result        `json:"t"`      // ceiling T of the payment's shape
	Accept PGBenchResult `json:"accept"` // P of the accept transaction (pgbench accept)
	Burst  Result        `json:"burst"`  // the open loop: its answers and latency
	// Accepted are the new payments answered with a payment (201, 402, 202) in the window, and
	// Refused those answered 503 (the backlog's bound).
	Accepted, Refused int64
	AcceptedRate      float64 // Accepted per second of the window
	BacklogPeak       int64   // the most payments queued at once
	// Drain is payments finished per second from the burst's end until the backlog was empty;
	// LastFinal the seconds from the burst's end until no payment was processing.
	Drain, LastFinal float64
	Samples          []BacklogSample    `json:"samples"`
	PerPayment       map[string]float64 `json:"per_payment"` // counters over the burst and drain ÷ accepted
	CPU              *CPUUse            `json:"cpu,omitempty"`
	Targets          []Target           `json:"targets"`
	Verdict
}

// BacklogSample is the backlog at one moment, seconds after the burst began.
type BacklogSample struct {
	At         float64 `json:"t"`
	Queued     int64   `json:"queued"`
	Processing int64   `json:"processing"` // queued or running
}

// Backlog reads how many payments are queued in the start backlog and how many are processing.
type Backlog func(ctx context.Context) (queued, processing int64, err error)

// backlogEvery is how often the payday reads the backlog. Each read counts every record, in a
// backend that competes for the CPU with the drain it measures: rarely enough that it costs the
// drain little, often enough for its figures (the drain is minutes long).
const backlogEvery = 5 * time.Second

// backlogWatch reads the backlog every so often, from the burst's start until stopped.
type backlogWatch struct {
	start   time.Time // the burst's: samples count from it
	mu      sync.Mutex
	samples []BacklogSample
	err     error         // the last read's
	read    chan struct{} // a read was recorded (one signal held at most)
	cancel  context.CancelFunc
	reads   sync.WaitGroup
}

func watchBacklog(ctx context.Context, read Backlog, start time.Time, every time.Duration) *backlogWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &backlogWatch{start: start, read: make(chan struct{}, 1), cancel: cancel}
	w.reads.Go(func() {
		for ; ctx.Err() == nil; sleep(ctx, every) {
			q, n, err := read(ctx)
			w.mu.Lock()
			if w.err = err; err == nil {
				w.samples = append(w.samples, BacklogSample{At: time.Since(start).Seconds(), Queued: q, Processing: n})
			}
			w.mu.Unlock()
			select {
			case w.read <- struct{}{}:
			default:
			}
		}
	})
	return w
}

// drained waits for a read after ended that finds no payment processing, and returns when that
// read was made; it fails on a read that fails, or when none finds the backlog drained within
// patience of ended.
func (w *backlogWatch) drained(ctx context.Context, ended time.Time, patience time.Duration) (time.Time, error) {
	deadline := time.NewTimer(time.Until(ended.Add(patience)))
	defer deadline.Stop()
	for {
		w.mu.Lock()
		err, last := w.err, BacklogSample{At: -1, Processing: -1}
		if n := len(w.samples); n > 0 {
			last = w.samples[n-1]
		}
		w.mu.Unlock()
		at := w.start.Add(time.Duration(last.At * float64(time.Second)))
		switch {
		case err != nil:
			return time.Time{}, err
		case last.Processing == 0 && at.After(ended):
			return at, nil
		}
		select {
		case <-w.read:
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("payday: %d payments still processing %s after the burst", last.Processing, patience)
		}
	}
}

// stop ends the reads and returns the samples taken.
func (w *backlogWatch) stop() []BacklogSample {
	w.cancel()
	w.reads.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples
}

// RunPayday runs the payday on s with fx's merchants: o's Duration is the burst's window, its
// Concurrency the cap on requests in flight; drainFor bounds the wait for the last payment.
func RunPayday(ctx context.Context, s Stack, fx *Fixture, o Options, drainFor time.Duration) (*Payday, error) {
	p := &Payday{Header: Header{Started: time.Now().UTC(), Options: o}}
	ss := newSession(s, o, "payday: ")
	t, err := ss.run(ctx, step{name: RunTOwn, shape: &PaymentShape, opts: Options{Duration: min(o.Duration, 15*time.Second)}})
	ss.o.Warmup = 0 // every payment of the burst counts
	if err != nil {
		return nil, err
	}
	p.T = t
	if p.Accept, err = PGBench(ctx, PGBenchOptions{DatabaseURL: s.DatabaseURL, Clients: 32, Duration: 10 * time.Second, Script: PGBenchAccept, Rows: 10_000}); err != nil {
		return nil, fmt.Errorf("pgbench accept: %w", err)
	}
	o.Progress("%-40s %8.1f tps  p50 %7.2f ms  p99 %7.2f ms", "payday: pgbench accept", p.Accept.TPS, p.Accept.P50MS, p.Accept.P99MS)
	if err := s.Settle(ctx); err != nil {
		return nil, err
	}

	before, err := s.Counters(ctx)
	if err != nil {
		return nil, err
	}
	cpuBefore := s.CPU()
	burstAt := time.Now()
	w := watchBacklog(ctx, s.Backlog, burstAt, backlogEvery)
	defer w.stop()
	burst := Options{Rate: PaydayFactor * t.Throughput, Concurrency: max(o.Concurrency, 256), Duration: o.Duration}
	p.Burst, err = ss.run(ctx, step{name: "burst at " + fmt.Sprint(PaydayFactor) + " × T", opts: burst, fx: fx})
	if err != nil {
		return nil, err
	}
	ended := time.Now()
	o.Progress("payday: waiting for every accepted payment to be final")
	final, err := w.drained(ctx, ended, drainFor)
	if err != nil {
		return nil, err
	}
	p.Samples = w.stop()
	after, err := s.Counters(ctx)
	if err != nil {
		return nil, err
	}
	p.summarize(ended.Sub(burstAt).Seconds(), final.Sub(ended).Seconds(), before, after)
	if s.CPU != nil {
		p.CPU = cpuUse(growth(cpuBefore, s.CPU()), final.Sub(burstAt), "new payment", p.Accepted)
	}
	o.Progress("payday: checking the payments at the bank simulator and running kasa verify")
	p.Verdict, err = s.Check(ctx, ss.payments, nil, nil)
	p.Targets = p.targets()
	return p, err
}

// summarize derives the payday's figures from the burst, the samples and the counters.
func (p *Payday) summarize(burstEnd, lastFinal float64, before, after map[string]int64) {
	b := p.Burst
	p.Accepted = b.NewPayments
	for label, n := range b.Answers {
		if strings.HasPrefix(label, "503") {
			p.Refused += n
		}
	}
	p.AcceptedRate = ratio(float64(p.Accepted), b.Duration)
	p.LastFinal = lastFinal
	var atEnd, atEmpty *BacklogSample
	for i := range p.Samples {
		s := &p.Samples[i]
		p.BacklogPeak = max(p.BacklogPeak, s.Queued)
		if s.At >= burstEnd && atEnd == nil {
			atEnd = s
		}
		if atEnd != nil && atEmpty == nil && s.Queued == 0 {
			atEmpty = s
		}
	}
	if atEmpty == nil && len(p.Samples) > 0 { // the last sample came before the queue read empty
		atEmpty = &p.Samples[len(p.Samples)-1]
	}
	if atEnd != nil && atEmpty != nil && atEmpty.At > atEnd.At {
		p.Drain = float64(atEnd.Processing-atEmpty.Processing) / (atEmpty.At - atEnd.At)
	}
	p.PerPayment = perOp(growth(before, after), p.Accepted)
}

// targets are issue's goals for the payday run.
func (p *Payday) targets() []Target {
	t := rate(p.T)
	out := []Target{
		{Name: "accepted vs the accept transaction", Formula: "accepted/s ÷ pgbench accept tps", Value: ratio(p.AcceptedRate, p.Accept.TPS), Threshold: 0.7,
			Inputs: fmt.Sprintf("%.1f ÷ %.1f; offered %.1f/s, so at most %.2f", p.AcceptedRate, p.Accept.TPS, p.Burst.Rate, ratio(p.Burst.Rate, p.Accept.TPS))},
		{Name: "drain vs Temporal", Formula: "payments finished/s while the backlog drained ÷ T", Value: ratio(p.Drain, t), Threshold: 0.8,
			Inputs: fmt.Sprintf("%.1f ÷ %.1f", p.Drain, t)},
	}
	for i := range out {
		out[i].Met = out[i].Value >= out[i].Threshold
	}
	p99 := p.Burst.Latency.P99
	out = append(out, Target{Name: "accept p99 while the backlog grows", Formula: "ms (at most)", Value: p99, Threshold: 50, Met: p99 > 0 && p99 <= 50,
		Inputs: fmt.Sprintf("p50 %.1f ms, p99 %.1f ms over %d answers", p.Burst.Latency.P50, p99, p.Burst.Requests)})
	for _, c := range []struct {
		name, counter string
		most          float64
	}{{"statements per payment", "statements kasa", 12}, {"WAL bytes per payment", "wal bytes kasa", 5000}} {
		v, ok := p.PerPayment[c.counter]
		out = append(out, Target{Name: c.name, Formula: "pg_stat_statements of kasa's database ÷ accepted (at most)", Value: v, Threshold: c.most,
			Met: ok && v <= c.most, Inputs: fmt.Sprintf("%s over the burst and its drain", c.counter)})
	}
	return out
}
