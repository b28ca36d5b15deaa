package payment

import "time"

// Status is where a payment is in its life. Unknown is never treated as failed: the bank may have
// moved the money, so only reconciliation (or an operator) may resolve it.
type Status string

const (
	StatusProcessing Status = "processing"
	StatusSucceeded  Status = "succeeded"
	StatusFailed     Status = "failed"
	StatusUnknown    Status = "unknown"
	// A manual-capture payment authorized at the bank waits in requires_capture for its capture
	// or cancel; canceled is where a cancel, or the end of its capture window, leaves it.
	StatusRequiresCapture Status = "requires_capture"
	StatusCanceled        Status = "canceled"
)

// Failure codes a failed payment carries.
const (
	FailureInsufficientFunds = "insufficient_funds"
	FailureDeclined          = "declined"
	// FailureAuthorizationExpired: the capture window ended before a capture; the hold was let go.
	FailureAuthorizationExpired = "authorization_expired"
	// FailureCanceled: the merchant canceled the authorization.
	FailureCanceled = "canceled"
)

// DefaultCaptureWindow is how long a manual payment waits for its capture unless configured
// otherwise (KASA_CAPTURE_WINDOW).
const DefaultCaptureWindow = 7 * 24 * time.Hour

var transitions = map[Status][]Status{
	StatusProcessing:      {StatusSucceeded, StatusFailed, StatusUnknown, StatusRequiresCapture},
	StatusRequiresCapture: {StatusSucceeded, StatusCanceled, StatusUnknown},
	StatusUnknown:         {StatusSucceeded, StatusFailed, StatusRequiresCapture, StatusCanceled},
}

// CanBecome reports whether s may move to next.
func (s Status) CanBecome(next Status) bool {
	for _, t := range transitions[s] {
		if t == next {
			return true
		}
	}
	return false
}

// Final reports whether no further transition is possible.
func (s Status) Final() bool { return s == StatusSucceeded || s == StatusFailed || s == StatusCanceled }

// Answered reports whether the request that created the payment has its answer: the payment is
// final, or authorized and waiting for its capture.
func (s Status) Answered() bool { return s.Final() || s == StatusRequiresCapture }
