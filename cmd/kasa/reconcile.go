package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

const reconcileUsage = `usage: kasa reconcile [--dry-run] [--json] [--date YYYY-MM-DD]... [--merchant <id>... | --all-merchants] <settlement.csv | ->

Matches a provider settlement file (settlement_date,provider_charge_id,reference,amount,currency,status
and optionally a seventh column type, charge, refund or capture; then a trailer line per day:
trailer,<day>,<lines>,<as_of>) to kasa's payments (charge and capture lines) and refunds (refund
lines): settles unknown ones (charged / refunded when listed; not charged / not refunded when the
file's trailer proves it complete for their day, past the booking window, their merchant is in the
declared scope, and it does not list them) and reports every mismatch without changing it. The scope is
declared here (--merchant, --all-merchants) or by the file's row scope,<all | merchant ids>,<charge |
refund | charge refund>; with neither, nothing unlisted is released. Refunds are covered only when the
file's scope row says so. A reference listed twice is a charged_twice mismatch.

  --dry-run          report what the import would do; settle nothing, record nothing
  --json             print the report as JSON (the admin endpoint's body) instead of text
  --date D           declare a UTC day the file covers (repeatable); every line and trailer must be on one
  --merchant ID      declare the file covers this merchant (repeatable); only its payments are released
  --all-merchants    declare the file covers every merchant

exit status: 0 no unresolved mismatch (of a payment or a refund), 1 mismatches, 2 invalid file or usage,
3 could not run (database or Temporal unavailable, or the database not migrated: it never waits;
nothing is lost, run it again).
`

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func runReconcile(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "")
	dryRun := fs.Bool("dry-run", false, "")
	allMerchants := fs.Bool("all-merchants", false, "")
	var dates, merchants listFlag
	fs.Var(&dates, "date", "")
	fs.Var(&merchants, "merchant", "")
	// Flags may come before or after the file name.
	var files []string
	args := os.Args[2:]
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Print(reconcileUsage)
				return nil
			}
			fmt.Fprintf(os.Stderr, "kasa reconcile: %v\n\n%s", err, reconcileUsage)
			return exitError(2)
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(files) != 1 {
		fmt.Fprint(os.Stderr, "kasa reconcile: want exactly one settlement file\n\n"+reconcileUsage)
		return exitError(2)
	}
	if *allMerchants && len(merchants) > 0 {
		fmt.Fprint(os.Stderr, "kasa reconcile: --merchant and --all-merchants exclude each other\n\n"+reconcileUsage)
		return exitError(2)
	}
	opts := reconcile.Options{DryRun: *dryRun, AllMerchants: *allMerchants}
	for _, d := range dates {
		day, err := reconcile.ParseDay(d)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kasa reconcile: --date %q: %v\n", d, err)
			return exitError(2)
		}
		opts.Days = append(opts.Days, day)
	}
	for _, m := range merchants {
		id, err := uuid.Parse(m)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kasa reconcile: --merchant %q: not a merchant id\n", m)
			return exitError(2)
		}
		opts.Merchants = append(opts.Merchants, id)
	}

	// Parse first: an invalid file is reported without touching the database or Temporal.
	file, err := parseFile(files[0])
	var fe *reconcile.FileError
	if errors.As(err, &fe) {
		fmt.Fprintf(os.Stderr, "kasa reconcile: %s: invalid settlement file, nothing was changed:\n", files[0])
		for _, le := range fe.Errors {
			fmt.Fprintln(os.Stderr, "  "+le.Error())
		}
		if fe.Omitted > 0 {
			fmt.Fprintf(os.Stderr, "  ... and %d more error(s)\n", fe.Omitted)
		}
		return exitError(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kasa reconcile: %v\n", err)
		return exitError(2)
	}

	if cfg.Secret.Key == "" {
		cfg.Secret.Key = strings.Repeat("0", 64) // reconciliation never touches secrets
	}
	// Tried once: a database or Temporal that is away or behind ends it with 3 at once.
	st, tc, err := connect(ctx, cfg, log, temporalOnce, false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kasa reconcile: could not run, nothing was changed (run it again): %v\n", err)
		return exitError(3)
	}
	defer st.Close()
	defer tc.Close()

	bar := reconcile.NewProgressBar(os.Stderr, len(file.Lines))
	opts.Progress = bar.Update
	r := &reconcile.Reconciler{Store: st, Settler: workflows.Starter{Client: tc, TaskQueue: cfg.Temporal.TaskQueue}, Workers: st,
		BookingWindow: cfg.Provider.BookingWindow, Logger: log, Runs: st, Source: "cli"}
	report, err := r.Reconcile(ctx, file, opts)
	bar.Done()
	if errors.As(err, &fe) { // a line or trailer outside the declared --date days
		for _, le := range fe.Errors {
			fmt.Fprintln(os.Stderr, "  "+le.Error())
		}
		return exitError(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kasa reconcile: could not finish (what was settled stays settled; run it again): %v\n", err)
		return exitError(3)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			return err
		}
	} else {
		report.WriteText(os.Stdout, files[0])
	}
	if !report.OK() {
		return exitError(1)
	}
	return nil
}

func parseFile(name string) (*reconcile.File, error) {
	if name == "-" {
		return reconcile.ParseFile(os.Stdin)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return reconcile.ParseFile(f)
}
