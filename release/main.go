// Command release prepares and checks a release of this repository's
// modules as a module proxy would serve them (see RELEASING.md).
//
//	go run ./release check   [-version v0.1.0]  # CI: proxy, consumers, go install, tidy
//	go run ./release prepare -version v0.2.0    # before tagging: requires and go.sum
//	go run ./release proxy   -version v0.1.0 -out DIR
//
// The published modules are the root, otelsqllock, pgtest/pgdocker and
// the contrib modules (goose, migrate, gocron); the others
// (examples with dependencies of their own, bench/, release/) are never
// tagged but require the published ones at the release version too.
// Every step runs the go command with GOWORK=off, a file proxy built from
// the working tree in front of the configured one, and a module cache of
// its own (so a version built from an older tree is never reused).
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// modulePath is the root module's path; every in-repo module's starts so.
const modulePath = "github.com/sqllock/sqllock"

// published are the directories of the modules a release tags.
var published = []string{".", "otelsqllock", "pgtest/pgdocker", "contrib/sqllockgoose", "contrib/sqllockmigrate", "contrib/sqllockgocron"}

// internalModules are the in-repo modules that are never tagged.
var internalModules = []string{"bench", "examples/gocron", "examples/otel", "release"}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	version := fs.String("version", "", "the release version (default: the one the in-repo modules require)")
	out := fs.String("out", "", "proxy: the directory to write the file proxy to")
	fs.Parse(os.Args[2:])
	root, err := repoRoot()
	must(err)
	if *version == "" {
		*version, err = requiredVersion(root)
		must(err)
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(*version) {
		must(fmt.Errorf("release: version %q: want vMAJOR.MINOR.PATCH", *version))
	}
	switch os.Args[1] {
	case "proxy":
		if *out == "" {
			usage()
		}
		must(buildProxy(root, *version, *out))
	case "check":
		must(check(root, *version))
	case "prepare":
		must(prepare(root, *version))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: release check [-version V] | prepare -version V | proxy -version V -out DIR")
	os.Exit(2)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("release: run inside the repository: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// pathOf returns the module path of the in-repo module in dir.
func pathOf(dir string) string {
	if dir == "." {
		return modulePath
	}
	return modulePath + "/" + dir
}

var requireRE = regexp.MustCompile(`(?m)^(\s*(?:require\s+)?)(` + regexp.QuoteMeta(modulePath) + `(?:/[a-z/]+)?) (v[^\s]+)`)

// requiredVersion returns the one version at which the in-repo modules
// require each other (an error when they disagree).
func requiredVersion(root string) (string, error) {
	seen := map[string]bool{}
	for _, dir := range append(append([]string{}, published...), internalModules...) {
		b, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		if err != nil {
			return "", err
		}
		for _, m := range requireRE.FindAllStringSubmatch(string(b), -1) {
			seen[m[3]] = true
		}
	}
	if len(seen) != 1 {
		return "", fmt.Errorf("release: the in-repo modules require each other at %d versions (%v); want one", len(seen), keys(seen))
	}
	return keys(seen)[0], nil
}

func keys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// buildProxy writes a file proxy serving every published module at version
// from the working tree.
func buildProxy(root, version, out string) error {
	for _, dir := range published {
		mv := module.Version{Path: pathOf(dir), Version: version}
		esc, err := module.EscapePath(mv.Path)
		if err != nil {
			return err
		}
		at := filepath.Join(out, esc, "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return err
		}
		var zb bytes.Buffer
		if err := modzip.CreateFromDir(&zb, mv, filepath.Join(root, dir)); err != nil {
			return fmt.Errorf("release: zip %s: %w", mv, err)
		}
		if err := checkZip(zb.Bytes()); err != nil {
			return fmt.Errorf("release: zip %s: %w", mv, err)
		}
		gomod, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		if err != nil {
			return err
		}
		if bytes.Contains(gomod, []byte("\nreplace")) {
			return fmt.Errorf("release: %s/go.mod has a replace directive: consumers ignore it, and go install refuses it", dir)
		}
		info, _ := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
		files := map[string][]byte{version + ".zip": zb.Bytes(), version + ".mod": gomod, version + ".info": info, "list": []byte(version + "\n")}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkZip refuses a module zip that carries build output or a go.work.
func checkZip(b []byte) error {
	r, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return err
	}
	for _, f := range r.File {
		name := f.Name[strings.Index(f.Name, "/")+1:]
		if strings.HasSuffix(name, ".test") || strings.HasSuffix(name, ".out") {
			return fmt.Errorf("it would publish %s (build output: run from a clean tree)", f.Name)
		}
	}
	return nil
}

// env is the go command's environment for one step: the file proxy first,
// a module cache of the step's own, no workspace, no checksum database for
// this repository's modules (their versions exist only in the proxy).
type env struct {
	proxy, cache, gobin string
}

func newEnv(root, version string) (*env, func(), error) {
	tmp, err := os.MkdirTemp("", "sqllock-release-")
	if err != nil {
		return nil, nil, err
	}
	e := &env{proxy: filepath.Join(tmp, "proxy"), cache: filepath.Join(tmp, "modcache"), gobin: filepath.Join(tmp, "bin")}
	cleanup := func() {
		exec.Command("chmod", "-R", "u+w", tmp).Run()
		os.RemoveAll(tmp)
	}
	if err := buildProxy(root, version, e.proxy); err != nil {
		cleanup()
		return nil, nil, err
	}
	return e, cleanup, nil
}

// run runs the go command in dir and returns its combined output.
func (e *env) run(dir string, args ...string) (string, error) {
	upstream, _ := exec.Command("go", "env", "GOPROXY").Output()
	shared, _ := exec.Command("go", "env", "GOMODCACHE").Output()
	proxies := []string{"file://" + e.proxy}
	if s := strings.TrimSpace(string(shared)); s != "" {
		// The shared module cache's downloads are a file proxy too: what
		// this machine fetched before is not fetched again.
		proxies = append(proxies, "file://"+filepath.Join(s, "cache", "download"))
	}
	proxies = append(proxies, strings.TrimSpace(string(upstream)))
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY="+strings.Join(proxies, ","),
		"GONOSUMDB="+modulePath, "GOMODCACHE="+e.cache, "GOBIN="+e.gobin, "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out), nil
}

// consumer is a fresh module that uses one published module as a user
// would.
type consumer struct {
	name, get string
	files     map[string]string
	noDocker  bool // its go.mod and go.sum must name no docker or containerd module
	wants     string
}

var consumers = []consumer{
	{name: "root", get: modulePath, noDocker: true, files: map[string]string{
		"main.go": `package main

import (
	"database/sql"
	"fmt"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/poolguard"
)

func main() {
	db, err := sql.Open("postgres", "")
	if err == nil {
		l := sqllock.New(db)
		fmt.Println(l.Stats(), poolguard.Discard)
	}
}
`,
		"main_test.go": `package main

import (
	"testing"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/sqllockmock"
)

func TestServer(t *testing.T) {
	_ = sqllockmock.ExpectServerCheck
	_ = pgtest.Start
}
`}},
	{name: "pgdocker", get: modulePath + "/pgtest/pgdocker", wants: "github.com/ory/dockertest/v3", files: map[string]string{
		"main_test.go": `package main

import (
	"testing"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/pgtest/pgdocker"
)

func TestMain(m *testing.M) { pgtest.Run(m) }

func TestServer(t *testing.T) { _ = pgdocker.Start }
`, "main.go": "package main\n\nfunc main() {}\n"}},
	{name: "otelsqllock", get: modulePath + "/otelsqllock", wants: "go.opentelemetry.io/otel", files: map[string]string{
		"main.go": `package main

import (
	"fmt"

	"go.opentelemetry.io/otel"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/otelsqllock"
)

// Both packages, side by side, with no alias.
func main() {
	o, err := otelsqllock.New(otelsqllock.WithMeterProvider(otel.GetMeterProvider()))
	if err == nil {
		var _ sqllock.Observer = o
	}
	fmt.Println(err)
}
`}},
	{name: "goose", get: modulePath + "/contrib/sqllockgoose", noDocker: true, wants: "github.com/pressly/goose/v3", files: map[string]string{
		"main.go": `package main

import (
	"database/sql"

	"github.com/pressly/goose/v3"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgoose"
)

func main() {
	db, err := sql.Open("postgres", "")
	if err == nil {
		_ = goose.WithSessionLocker(sqllockgoose.New(sqllock.New(db)))
	}
}
`}},
	// golang-migrate's own go.mod names Docker modules (for its tests): its
	// users have them in go.sum already, so this consumer is not asked.
	{name: "migrate", get: modulePath + "/contrib/sqllockmigrate", wants: "github.com/golang-migrate/migrate/v4", files: map[string]string{
		"main.go": `package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockmigrate"
)

func main() {
	db, err := sql.Open("postgres", "")
	if err == nil {
		_, err = sqllockmigrate.OpenPostgres(context.Background(), sqllock.New(db), nil)
	}
	fmt.Println(err)
}
`}},
	{name: "gocron", get: modulePath + "/contrib/sqllockgocron", noDocker: true, wants: "github.com/go-co-op/gocron/v2", files: map[string]string{
		"main.go": `package main

import (
	"database/sql"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgocron"
)

func main() {
	db, err := sql.Open("postgres", "")
	if err == nil {
		l := sqllock.New(db)
		_ = gocron.WithDistributedElector(sqllockgocron.NewElector(l.Election(sqllock.Hash("leader")), "a"))
		_ = gocron.WithDistributedLocker(sqllockgocron.NewLocker(l))
	}
}
`}},
}

// commands are the published commands, installed with go install PATH@V.
var commands = []string{modulePath + "/cmd/sqllock", modulePath + "/pgtest/cmd/pgtest", modulePath + "/pgtest/pgdocker/cmd/pgdocker"}

var dockerRE = regexp.MustCompile(`(?m)^\S*(docker|containerd)\S*\s`)

// check proves that the tree, released at version, can be used as users
// get it: each consumer runs go get, go mod tidy, go build and go vet; each
// command installs with go install; every in-repo module is tidy.
func check(root, version string) error {
	e, cleanup, err := newEnv(root, version)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := packageNames(root); err != nil {
		return err
	}
	tmp := filepath.Dir(e.proxy)
	for _, c := range consumers {
		dir := filepath.Join(tmp, "consumer-"+c.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for name, text := range c.files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				return err
			}
		}
		steps := [][]string{{"mod", "init", "example.com/consumer/" + c.name}, {"get", c.get + "@" + version}, {"mod", "tidy"}, {"build", "./..."}, {"vet", "./..."}}
		for _, s := range steps {
			if _, err := e.run(dir, s...); err != nil {
				return fmt.Errorf("release: consumer of %s: %w", c.get, err)
			}
		}
		gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
		gosum, _ := os.ReadFile(filepath.Join(dir, "go.sum"))
		if c.noDocker {
			if m := dockerRE.FindAll(append(gomod, gosum...), -1); len(m) > 0 {
				return fmt.Errorf("release: a consumer of %s alone gets Docker modules in its go.mod or go.sum: %s", c.get, bytes.Join(m, []byte(", ")))
			}
		}
		if c.wants != "" && !bytes.Contains(gomod, []byte(c.wants)) {
			return fmt.Errorf("release: a consumer of %s does not get %s:\n%s", c.get, c.wants, gomod)
		}
		fmt.Printf("release: consumer of %s@%s: go get, tidy, build, vet ok; go.mod %d lines, go.sum %d lines\n",
			c.get, version, lines(gomod), lines(gosum))
	}
	for _, cmd := range commands {
		if _, err := e.run(tmp, "install", cmd+"@"+version); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		fmt.Printf("release: go install %s@%s ok\n", cmd, version)
	}
	return tidy(root, e, false)
}

// packageNames fails when the package of a published module other than
// the root is not named as its directory, the last element of its import
// path (as OpenTelemetry's instrumentation packages are: otelhttp in
// .../otelhttp), so that its users import it with no alias.
func packageNames(root string) error {
	for _, dir := range published {
		if dir == "." {
			continue // the root module holds many packages, sqllock first
		}
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			return err
		}
		want := filepath.Base(dir)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
			if err != nil {
				return fmt.Errorf("release: %w", err)
			}
			if got := file.Name.Name; got != want {
				return fmt.Errorf("release: %s is package %s: a published module's package is named as its directory (%s)", f, got, want)
			}
		}
	}
	fmt.Printf("release: each published module's package is named as its directory\n")
	return nil
}

// tidy runs go mod tidy in every in-repo module: with write, it updates
// their files; otherwise it fails when tidy would change a go.mod, or a
// go.sum line other than the checksums of this repository's own modules
// (those are written by prepare, for the tree that is tagged).
func tidy(root string, e *env, write bool) error {
	var bad []string
	for _, dir := range append(append([]string{}, published...), internalModules...) {
		abs := filepath.Join(root, dir)
		if !write {
			// In a copy: the checksums of this repository's modules in
			// go.sum are those of the tree last prepared, which the go
			// command would refuse for this tree's zips.
			tmp, err := os.MkdirTemp(filepath.Dir(e.proxy), "tidy-")
			if err != nil {
				return err
			}
			if out, err := exec.Command("cp", "-a", abs+"/.", tmp).CombinedOutput(); err != nil {
				return fmt.Errorf("release: copy %s: %v: %s", dir, err, out)
			}
			abs = tmp
		}
		if err := stripOwnSums(filepath.Join(abs, "go.sum")); err != nil {
			return err
		}
		if write {
			if _, err := e.run(abs, "mod", "tidy"); err != nil {
				return err
			}
			continue
		}
		out, err := e.run(abs, "mod", "tidy", "-diff")
		if err == nil {
			continue
		}
		if diff := significant(out); diff != "" {
			bad = append(bad, fmt.Sprintf("%s:\n%s", dir, diff))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("release: go mod tidy would change (run it in each module, or go run ./release prepare):\n%s", strings.Join(bad, "\n"))
	}
	fmt.Printf("release: every in-repo module is tidy (%d modules)\n", len(published)+len(internalModules))
	return nil
}

// stripOwnSums removes the checksums of this repository's modules from
// the go.sum at p, if there is one.
func stripOwnSums(p string) error {
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var keep []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if !ownSum(line) {
			keep = append(keep, line)
		}
	}
	return os.WriteFile(p, []byte(strings.Join(keep, "")), 0o644)
}

// ownSum reports whether a go.sum line is about this repository's modules.
func ownSum(line string) bool {
	return strings.HasPrefix(line, modulePath+" ") || strings.HasPrefix(line, modulePath+"/")
}

// significant returns the changed lines of a tidy -diff that matter:
// every go.mod line, and go.sum lines of modules from outside this
// repository.
func significant(diff string) string {
	var b strings.Builder
	file := ""
	sc := bufio.NewScanner(strings.NewReader(diff))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "+++ ") || strings.HasPrefix(line, "--- "):
			file = filepath.Base(strings.Fields(line)[1])
		case strings.HasPrefix(line, "+") || strings.HasPrefix(line, "-"):
			if file == "go.sum" && ownSum(line[1:]) {
				continue
			}
			fmt.Fprintf(&b, "  %s: %s\n", file, line)
		}
	}
	if file == "" {
		return diff // no diff: tidy failed
	}
	return b.String()
}

// prepare sets every in-repo requirement (and go.work's replacements) to
// version and tidies each module
// against a proxy of the tree at that version, so that the go.sum files
// carry the checksums of exactly what will be tagged; then it checks.
func prepare(root, version string) error {
	files := []string{"go.work"}
	for _, dir := range append(append([]string{}, published...), internalModules...) {
		files = append(files, filepath.Join(dir, "go.mod"))
	}
	for _, f := range files {
		p := filepath.Join(root, f)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b = requireRE.ReplaceAll(b, []byte("${1}${2} "+version))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	e, cleanup, err := newEnv(root, version)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := tidy(root, e, true); err != nil {
		return err
	}
	cleanup()
	return check(root, version)
}

func lines(b []byte) int { return bytes.Count(b, []byte("\n")) }
