package reconcile

import (
	"errors"
	"slices"

	"github.com/google/uuid"
)

// Scopes a report names: every merchant, the merchants listed, or none declared.
const (
	ScopeAll       = "all"
	ScopeMerchants = "merchants"
	ScopeNone      = "none"
)

// ErrScopeConflict is an import that declares both merchants and all merchants.
var ErrScopeConflict = errors.New("declare either merchants or all merchants, not both")

// scope is what an import may release by the file's silence: the merchants the import and the
// file declare (both, when both do), and the line types the file covers.
type scope struct {
	declared         bool // some merchants are declared (by the import, the file or both)
	all              bool
	merchants        []uuid.UUID // when declared and not all; may be empty (nothing in common)
	charges, refunds bool
}

// scopeOf combines the import's declaration with the file's scope row. Without a scope row the
// file covers charges only: the type column alone does not say the bank listed every refund.
func scopeOf(f *File, o Options) (scope, error) {
	if o.AllMerchants && len(o.Merchants) > 0 {
		return scope{}, ErrScopeConflict
	}
	sc := scope{charges: true}
	fs := f.Scope
	if fs != nil {
		sc.charges, sc.refunds = fs.Charges, fs.Refunds
	}
	byImport := o.AllMerchants || len(o.Merchants) > 0
	switch {
	case byImport && fs != nil:
		sc.declared = true
		switch {
		case o.AllMerchants && fs.AllMerchants:
			sc.all = true
		case o.AllMerchants:
			sc.merchants = distinct(fs.Merchants)
		case fs.AllMerchants:
			sc.merchants = distinct(o.Merchants)
		default:
			for _, m := range distinct(o.Merchants) {
				if slices.Contains(fs.Merchants, m) {
					sc.merchants = append(sc.merchants, m)
				}
			}
		}
	case byImport:
		sc.declared, sc.all, sc.merchants = true, o.AllMerchants, distinct(o.Merchants)
	case fs != nil:
		sc.declared, sc.all, sc.merchants = true, fs.AllMerchants, distinct(fs.Merchants)
	}
	if sc.merchants == nil && sc.declared && !sc.all {
		sc.merchants = []uuid.UUID{}
	}
	return sc, nil
}

func distinct(ids []uuid.UUID) []uuid.UUID {
	var out []uuid.UUID
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// name is the report's scope.
func (sc scope) name() string {
	switch {
	case !sc.declared:
		return ScopeNone
	case sc.all:
		return ScopeAll
	default:
		return ScopeMerchants
	}
}

// coverage says how the import treats k's unlisted operations: ok false, not at all (a file
// without the type column says nothing about refunds; declared merchants with none in common);
// check true, they are checked and may be released (within merchants, nil meaning all); check
// false, the scope leaves them out undeclared, so unknown ones are reported pending.
func (sc scope) coverage(k kind, typed bool) (check bool, merchants []uuid.UUID, ok bool) {
	if k == refund && !typed {
		return false, nil, false
	}
	if sc.declared && !sc.all {
		if len(sc.merchants) == 0 {
			return false, nil, false
		}
		merchants = sc.merchants
	}
	covered := sc.charges
	if k == refund {
		covered = sc.refunds
	}
	return sc.declared && covered, merchants, true
}

// undeclared is the detail of a pending entry the scope leaves out.
func (sc scope) undeclared(k kind) string {
	switch {
	case !sc.declared:
		return "the import declares no scope, so the file's silence releases nothing: declare the merchants the file covers " +
			"(kasa reconcile --merchant <id> or --all-merchants; admin: merchant_id=<id> or scope=all) or give the file a scope row"
	case k == refund:
		return "the file does not declare that it covers refunds (scope row: scope,<merchants>,charge refund), so it releases none"
	default:
		return "the file's scope row declares refunds only, so it releases no payment"
	}
}
