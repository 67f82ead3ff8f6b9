# The example worker's base: Debian trixie minbase (Python 3.13 with venv), made here by
# debootstrap into rootfs/ (e2e/images/build.sh), as localhost/harness-engine/base-python.
FROM scratch
COPY rootfs/ /
CMD ["/usr/bin/python3"]
