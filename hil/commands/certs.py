"""`hil certs`: certificates for the OPC UA server (and a client), or a password hash.

    hil certs                          # ./certs: server + client certificates and keys
    hil certs --dir /etc/hil/certs --hostname plant-sim.local --hostname 10.0.0.5
    hil certs --keep                   # only create what is missing
    hil certs --hash-password          # prompt, print a hash for [opcua.users]

Files (see hil/certs.py): server_cert.der / .pem, server_key.pem (0600), client_cert.der /
.pem, client_key.pem (0600). The server certificate's subjectAltName carries the
application URI (`[opcua] application_uri`, default urn:hil:opcua:server), localhost,
127.0.0.1, ::1, this machine's name and every --hostname: clients check the name they
connected to against it.
"""

from __future__ import annotations

import click

from hil import certs


@click.command(name="certs", help="Generate the OPC UA server/client certificates (or hash a password).")
@click.option("--dir", "directory", default=certs.DEFAULT_DIR, show_default=True,
              type=click.Path(file_okay=False), help="Directory to write the files into.")
@click.option("--hostname", "hostnames", multiple=True,
              help="DNS name or IP address the server is reached by (repeatable), in addition "
                   "to localhost, 127.0.0.1, ::1 and this host's name.")
@click.option("--application-uri", default=certs.SERVER_APPLICATION_URI, show_default=True,
              help="Server application URI; must equal [opcua] application_uri.")
@click.option("--client-uri", default=certs.CLIENT_APPLICATION_URI, show_default=True,
              help="Application URI of the client certificate.")
@click.option("--days", default=1825, show_default=True, type=click.IntRange(1, 36500),
              help="Validity in days.")
@click.option("--key-size", default=2048, show_default=True, type=click.Choice(["2048", "3072", "4096"]),
              help="RSA key size in bits.")
@click.option("--keep", is_flag=True, help="Keep existing certificate/key pairs; create only missing ones.")
@click.option("--no-client", is_flag=True, help="Do not create the client certificate.")
@click.option("--hash-password", is_flag=True,
              help="Prompt for a password and print its hash for [opcua.users] (no files written).")
def command(directory, hostnames, application_uri, client_uri, days, key_size, keep, no_client, hash_password):
    if hash_password:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
        click.echo(certs.hash_password(password))
        return
    names = certs.default_hostnames() + [h for h in hostnames if h not in certs.default_hostnames()]
    files = certs.generate_certs(
        directory,
        hostnames=names,
        server_uri=application_uri,
        client_uri=client_uri,
        days=days,
        key_size=int(key_size),
        overwrite=not keep,
        client=not no_client,
    )
    click.echo(f"server application URI {application_uri}; hosts {', '.join(names)}")
    for path in files.all():
        if path.exists():
            click.echo(f"  {path}")
