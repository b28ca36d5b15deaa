package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/workflows"
)

// WorkflowCeiling is ceiling T: workflows of the given shape with no work in their steps,
// started and awaited back to back by concurrency clients for warmup+duration, on a task queue
// of their own served by a worker in this process. Its Result is shaped like a load run's, with
// Path "temporal:<shape>". With cpu, it also reports what its measured window cost.
func WorkflowCeiling(ctx context.Context, tc client.Client, shape workflows.Shape, concurrency int, warmup, duration time.Duration, cpu CPU) (Result, error) {
	queue := "bench-shape-" + uuid.NewString()
	w := sdkworker.New(tc, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(workflows.ShapeWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowShape})
	w.RegisterActivityWithOptions(workflows.Noop, activity.RegisterOptions{Name: workflows.ActivityNoop})
	if err := w.Start(); err != nil {
		return Result{}, fmt.Errorf("ceiling worker: %w", err)
	}
	defer w.Stop()

	start := time.Now()
	measured, end := start.Add(warmup), start.Add(warmup+duration)
	cpuUsed := cpuWindow(ctx, cpu, measured, end)
	seconds := int((duration + time.Second - 1) / time.Second)
	series := make([]histogram, seconds)
	hists := make([]histogram, concurrency)
	errs := make([]int64, concurrency)
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				sent := time.Now()
				if !sent.Before(end) {
					return
				}
				o := client.StartWorkflowOptions{ID: "bench-shape-" + uuid.NewString(), TaskQueue: queue, EnableEagerStart: shape.Eager}
				if shape.SearchAttributes {
					o.TypedSearchAttributes = temporal.NewSearchAttributes(
						workflows.SearchPaymentStatus.ValueSet("processing"), workflows.SearchMerchantID.ValueSet("bench"))
				}
				run, err := tc.ExecuteWorkflow(ctx, o, workflows.WorkflowShape, shape)
				if err == nil {
					err = run.Get(ctx, nil)
				}
				if sent.Before(measured) {
					continue
				}
				if err != nil {
					errs[i]++
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				d := time.Since(sent)
				hists[i].record(d)
				if s := int(sent.Sub(measured) / time.Second); s < seconds {
					series[s].record(d)
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	res := Result{Path: "temporal:" + shape.String(), Mode: "closed", Concurrency: concurrency, Duration: duration.Seconds(), Answers: map[string]int64{}}
	var h histogram
	for i := range hists {
		h.merge(&hists[i])
		res.Errors += errs[i]
	}
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	res.Requests = h.count()
	res.Answers["completed"] = res.Requests
	res.Throughput = float64(res.Requests) / duration.Seconds()
	res.NewPayments, res.NewPaymentRate = res.Requests, res.Throughput
	res.Latency = h.latency()
	res.CPU = cpuUse(cpuUsed(), duration, "workflow", res.Requests)
	for i := range series {
		res.Series = append(res.Series, Second{Second: i, Requests: series[i].count(), P99: ms(series[i].quantile(0.99))})
	}
	return res, nil
}
