package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/tools/bench"
)

// StorePath is `kasa bench --store-path`: kasa's store steps without Temporal, beside pgbench's
// ceiling P and the minimal sketch M, on a PostgreSQL of its own; it writes
// <date>-store-path.md and .json to --out.
func StorePath(ctx context.Context, args []string, _ Config) error {
	var o bench.StorePathOptions
	fs := flag.NewFlagSet("kasa bench --store-path", flag.ContinueOnError)
	fs.Bool("store-path", true, "kasa's store steps (Begin, Reserve, Finalize) with the event pipeline, without Temporal, beside pgbench P and M")
	out := fs.String("out", "bench/results", "directory for <date>-store-path.md and .json")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "load before each store-path window, not measured")
	fs.IntVar(&o.Clients, "concurrency", 32, "goroutines running payments, and pgbench clients")
	merchants := fs.String("merchants", "1,1000", "merchant counts, one run each")
	pgbench := fs.Bool("pgbench", true, "also run pgbench P and M")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return ErrUsage
	}
	for _, s := range strings.Split(*merchants, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(fs.Output(), "kasa bench: --merchants is a list of counts, not %q\n", *merchants)
			return ErrUsage
		}
		o.Merchants = append(o.Merchants, n)
	}
	o.PGBench, o.Progress = *pgbench, progress
	rep, err := bench.StorePath(ctx, o)
	if err != nil {
		return err
	}
	rep.Machine, rep.Commit = machine(), commit()
	md := bench.StorePathMarkdown(rep)
	fmt.Print(md)
	if err := writeReport(*out, rep.Started, "-store-path", md, rep); err != nil {
		return err
	}
	return verdict(bench.Verdict{Correct: rep.Correct, Problems: rep.Problems})
}
