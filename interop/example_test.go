package interop_test

import (
	"fmt"
	"log"

	"github.com/sqllock/sqllock/interop"
)

func ExampleGolangMigrateURL() {
	// The key migrate.New("file://migrations", url) takes.
	k, err := interop.GolangMigrateURL("postgres://app@db:5432/app?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(k)
	fmt.Println(interop.GolangMigrate("/app", "public", "schema_migrations") == k)
	// Output:
	// 1726534663
	// true
}
