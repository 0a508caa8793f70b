// Package landlock holds a contained driver's Landlock rules: what any driver may read and
// execute (system libraries, certificates, name resolution), write (its private temporary
// directory, /dev/null) and connect to (the TCP ports its plugin's config adds), with signals and
// abstract unix sockets scoped to its own domain from ABI 6. The plugin host writes the
// launcher's argument with Arg and reports what the kernel lacks with Missing; the launcher
// enforces the rules with Apply on the thread that then executes the driver.
//
// Linux only.
package landlock
