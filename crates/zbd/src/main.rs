fn main() {
    println!("zbd");
}
