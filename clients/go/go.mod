module github.com/ringlock/ringlock/clients/go

go 1.19
