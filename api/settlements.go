package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
)

// Reconciler imports settlement files (reconcile.Reconciler).
type Reconciler interface {
	Import(ctx context.Context, f io.Reader, o reconcile.Options) (*reconcile.Report, error)
}

// MaxSettlementBytes is the largest settlement file POST /admin/v1/settlements accepts.
const MaxSettlementBytes = 16 << 20

// mediaError is a 415 naming the content type the route wants (it maps like errUnsupportedMedia).
type mediaError struct{ want string }

func (e mediaError) Error() string        { return "content type must be " + e.want }
func (e mediaError) Is(target error) bool { return target == errUnsupportedMedia }

// sizeError is a 413 naming the route's limit (it maps like errBodyTooLarge).
type sizeError struct{ limit string }

func (e sizeError) Error() string        { return "request body exceeds " + e.limit }
func (e sizeError) Is(target error) bool { return target == errBodyTooLarge }

var errNoReconciler = errors.New("settlement import is not configured on this server")

// errImportStopped: the server began shutting down during an import (a 503, as for a dependency
// that is away: the same file imported again finishes the job).
var errImportStopped = errors.New("the server is shutting down: the import stopped, what it settled stays settled; import the file again")

// settlements imports a settlement CSV (docs/reconciliation.md) and answers the reconciliation report:
// 200 whatever it found (report.ok says whether mismatches are left), 400
// invalid_settlement_file listing every line error (nothing changed then).
//
// Query parameters, optional: date=YYYY-MM-DD (repeatable) declares the days the file covers;
// merchant_id (repeatable) or scope=all declares the merchants the file covers (without either,
// or a scope row in the file, it releases nothing it does not list); dry_run=true reports what
// the import would do and changes nothing (dry_run=false, the default, imports). Any other
// parameter is refused.
func (s *Server) settlements(c *gin.Context) {
	// The import runs on past the server's write timeout (each settle may wait a minute for its
	// workflow), and its report is written when it ends. Only an admin's request gets here.
	_ = http.NewResponseController(c.Writer).SetWriteDeadline(time.Time{})
	if s.Reconciler == nil {
		s.writeError(c, errNoReconciler)
		return
	}
	if !s.queryOK(c, "date*", "merchant_id*", "scope", "dry_run") {
		return
	}
	mt, _, err := mime.ParseMediaType(c.GetHeader("Content-Type"))
	if err != nil || mt != "text/csv" {
		s.writeError(c, mediaError{want: "text/csv"})
		return
	}
	var opts reconcile.Options
	var ve payment.ValidationError
	for _, d := range c.QueryArray("date") {
		day, err := reconcile.ParseDay(d)
		if err != nil {
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "date", Message: err.Error()})
			continue
		}
		opts.Days = append(opts.Days, day)
	}
	for _, m := range c.QueryArray("merchant_id") {
		id, err := uuid.Parse(m)
		if err != nil {
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "merchant_id", Message: "must be a merchant id"})
			continue
		}
		opts.Merchants = append(opts.Merchants, id)
	}
	if v, ok := c.GetQuery("scope"); ok {
		switch {
		case v != "all":
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "scope", Message: "must be all (or name merchants with merchant_id)"})
		case len(c.QueryArray("merchant_id")) > 0:
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "scope", Message: "scope=all and merchant_id exclude each other"})
		default:
			opts.AllMerchants = true
		}
	}
	if v, ok := c.GetQuery("dry_run"); ok {
		switch v { // exactly: strconv.ParseBool would also take 1, t, TRUE...
		case "true", "false":
			opts.DryRun = v == "true"
		default:
			ve.Fields = append(ve.Fields, payment.FieldError{Field: "dry_run", Message: "must be true or false"})
		}
	}
	if len(ve.Fields) > 0 {
		s.writeError(c, &ve)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, MaxSettlementBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		s.writeError(c, sizeError{limit: "16 MiB"})
		return
	}
	if err != nil {
		s.writeError(c, &payment.ValidationError{Fields: []payment.FieldError{{Field: "body", Message: "could not be read"}}})
		return
	}
	// A shutdown stops the import as SIGTERM stops kasa reconcile: no further settlement is sent,
	// and it ends before the Temporal client and the database it settles through are closed,
	// whose errors would read as settlements that failed.
	ctx, cancel := context.WithCancelCause(c.Request.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.life, func() { cancel(errImportStopped) })
	defer stop()
	report, err := s.Reconciler.Import(ctx, bytes.NewReader(body), opts)
	if err != nil {
		switch {
		case errors.Is(context.Cause(ctx), errImportStopped):
			s.log.Warn("settlement import stopped: the server is shutting down", "request_id", requestID(c), "error", err)
			err = errImportStopped
		case c.Request.Context().Err() != nil:
			// The client closed its request, and the import stopped as on a shutdown (what it
			// settled stays settled, no run recorded): no error of kasa's, and no one to answer.
			s.log.Warn("settlement import stopped: the client left; what it settled stays settled, import the file again",
				"request_id", requestID(c), "error", err)
			c.AbortWithStatus(statusClientClosedRequest)
			return
		}
		s.writeError(c, err)
		return
	}
	s.log.Info("settlement file imported", "request_id", requestID(c), "dry_run", report.DryRun, "days", report.Days,
		"scope", report.Scope, "lines", report.Lines,
		"ok", report.OK(), "resolved_charged", report.Counts.ResolvedCharged,
		"resolved_not_charged", report.Counts.ResolvedNotCharged, "mismatches", report.Counts.Mismatches)
	writeJSON(c, http.StatusOK, report)
}
