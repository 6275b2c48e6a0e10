package stmt

import (
	"database/sql/driver"
	"reflect"
	"sync"
	"sync/atomic"
)

// pgx's simple protocol for the statements of pinned sessions (see
// the core's pinned.go).

// SimpleConns are the driver connections of pinned sessions whose driver
// is pgx: their statements carry pgx's option for its simple protocol
// (see driverQuery). SimpleCount is how many there are, so that no other
// statement pays for the look-up.
var (
	SimpleConns sync.Map // driver connection → the option
	SimpleCount atomic.Int64
)

// simpleOption returns the option that makes pgx send a statement on dc in
// its simple protocol, if dc is a pinned session's.
func simpleOption(dc any) (any, bool) {
	if SimpleCount.Load() == 0 || !ComparableConn(dc) {
		return nil, false
	}
	return SimpleConns.Load(dc)
}

// simpleModes caches SimpleModeOf's answer by driver connection type.
var simpleModes sync.Map // reflect.Type → any (nil: none)

// SimpleModeOf returns, for a pgx driver connection, the value of pgx's
// QueryExecMode that selects its simple protocol: pgx takes it as the
// first argument of a statement, ahead of the statement's own. The core
// imports no driver, so the type is found through the connection's
// Conn().Config().DefaultQueryExecMode, and the value by its name.
func SimpleModeOf(dc any) (any, bool) {
	if dc == nil {
		return nil, false
	}
	t := reflect.TypeOf(dc)
	if m, ok := simpleModes.Load(t); ok {
		return m, m != nil
	}
	m := findSimpleMode(dc)
	simpleModes.Store(t, m)
	return m, m != nil
}

func findSimpleMode(dc any) (mode any) {
	defer func() {
		if recover() != nil {
			mode = nil
		}
	}()
	conn := reflect.ValueOf(dc).MethodByName("Conn")
	if !conn.IsValid() || conn.Type().NumIn() != 0 || conn.Type().NumOut() != 1 {
		return nil
	}
	c := conn.Call(nil)[0]
	cfg := c.MethodByName("Config")
	if !cfg.IsValid() || cfg.Type().NumIn() != 0 || cfg.Type().NumOut() != 1 {
		return nil
	}
	v := cfg.Call(nil)[0]
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	f := v.FieldByName("DefaultQueryExecMode")
	if !f.IsValid() || !f.CanInt() {
		return nil
	}
	for i := range 16 {
		m := reflect.New(f.Type()).Elem()
		m.SetInt(int64(i))
		if s, ok := m.Interface().(interface{ String() string }); ok && s.String() == "simple protocol" {
			return m.Interface()
		}
	}
	return nil
}

// withOption returns nv with opt ahead of its values.
func withOption(opt any, nv []driver.NamedValue) []driver.NamedValue {
	out := make([]driver.NamedValue, 0, len(nv)+1)
	out = append(out, driver.NamedValue{Ordinal: 1, Value: opt})
	for _, v := range nv {
		v.Ordinal++
		out = append(out, v)
	}
	return out
}
